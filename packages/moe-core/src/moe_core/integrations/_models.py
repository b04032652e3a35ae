"""Every MoE model type of the supported transformers release: how `fuse` expresses its block, or why
it refuses it. `MODELS` maps model_type to a `BlockDescriptor` (served) or a `Refused` (with the
reason). `moe_core.integrations.transformers.moe_model_types` enumerates the MoE model types from
transformers itself; a test checks that every one of them is in this table.
"""

from __future__ import annotations

from dataclasses import replace

from moe_core.config import GroupScoring, Scoring
from moe_core.integrations._descriptors import (
    At,
    BlockDescriptor,
    Check,
    ClampedSilu,
    ConfigFields,
    ExpertsLayout,
    Fixed,
    Mapped,
    Refused,
    RouterDescriptor,
    RoutingDescriptor,
    Select,
    SharedDescriptor,
    SwigluOAI,
)

__all__ = ["MODELS"]

# ---- routing families ----------------------------------------------------------------------------

# Softmax over all experts, top-k, renormalized iff the router's norm_topk_prob (Qwen/OLMoE style).
_SOFTMAX_NORM_ATTR = RoutingDescriptor(top_k=At("gate.top_k"), renormalize=At("gate.norm_topk_prob"))
# Softmax, top-k, always renormalized (Mixtral style).
_SOFTMAX_RENORM = RoutingDescriptor(top_k=At("gate.top_k"), renormalize=True)
# Top-k of the logits, softmax over the k: equal to softmax over all, top-k, renormalized.
_TOPK_THEN_SOFTMAX_ROUTER = RoutingDescriptor(top_k=At("router.top_k"), renormalize=True)

# DeepSeek-V3 style: sigmoid, correction bias for selection, groups by their best two, renormalized
# (+1e-20) iff norm_topk_prob, times routed_scaling_factor; n_group None means no grouping.
_DEEPSEEK_V3 = RoutingDescriptor(
    top_k=At("gate.top_k"), scoring=Scoring.SIGMOID, renormalize=At("gate.norm_topk_prob"),
    renormalize_eps=1e-20, num_expert_groups=At("gate.num_group", 1), topk_groups=At("gate.topk_group", 1),
    correction_bias="gate.e_score_correction_bias", routed_scaling_factor=At("gate.routed_scaling_factor"))
_FP32_GATE = RouterDescriptor(weight="gate.weight", fp32=True)
_GATE = RouterDescriptor(weight="gate.weight")

_SHARED_EXPERTS = SharedDescriptor(module="shared_experts")
_QWEN_SHARED = SharedDescriptor(module="shared_expert", gate="shared_expert_gate")

_M = "transformers.models"


def _block(path: str) -> str:
    """"pkg.modeling_pkg:Class" -> the full module path inside transformers.models."""
    return f"{_M}.{path}"


# Where configs store the routed experts' count and width (num_experts and moe_intermediate_size
# unless named here), under the names transformers writes to config.json.
_MOE_WIDTH = ConfigFields()
_LOCAL_EXPERTS = ConfigFields(num_experts="num_local_experts")
_ROUTED_EXPERTS = ConfigFields(num_experts="n_routed_experts")
_DENSE_WIDTH = ConfigFields(intermediate_size="intermediate_size")
_LOCAL_EXPERTS_DENSE_WIDTH = ConfigFields(num_experts="num_local_experts", intermediate_size="intermediate_size")
# Bailing / Kimi configs store DeepSeek's fields under their own names (read through attribute_map).
_BAILING_NAMES = ConfigFields(paths=(("gate.top_k", "num_experts_per_token"), ("gate.num_group", "num_expert_group"),
                                     ("gate.norm_topk_prob", "moe_renormalize")))


def _qwen_like(block: str, shared: bool = False, always_renormalize: bool = False,
               config: ConfigFields = _MOE_WIDTH) -> BlockDescriptor:
    return BlockDescriptor(block=_block(block), router=_GATE,
                           routing=_SOFTMAX_RENORM if always_renormalize else _SOFTMAX_NORM_ATTR,
                           shared=_QWEN_SHARED if shared else None, config=config)


def _deepseek_v3_like(block: str, shared: bool = True, post_module: str | None = None,
                      checks: tuple[Check, ...] = (), config: ConfigFields = _ROUTED_EXPERTS) -> BlockDescriptor:
    return BlockDescriptor(block=_block(block), router=_FP32_GATE, routing=_DEEPSEEK_V3,
                           shared=_SHARED_EXPERTS if shared else None, post_module=post_module, checks=checks,
                           config=config)


def _granite(block: str, shared: bool = False) -> BlockDescriptor:
    return BlockDescriptor(block=_block(block), router=RouterDescriptor(weight="router.weight"),
                           routing=_TOPK_THEN_SOFTMAX_ROUTER,
                           shared=SharedDescriptor(module="shared_mlp") if shared else None,
                           config=_LOCAL_EXPERTS_DENSE_WIDTH)


_MIXTRAL = BlockDescriptor(block=_block("mixtral.modeling_mixtral:MixtralSparseMoeBlock"), router=_GATE,
                           routing=_SOFTMAX_RENORM, jitter_noise="jitter_noise", config=_LOCAL_EXPERTS_DENSE_WIDTH)
_QWEN3_VL = _qwen_like("qwen3_vl_moe.modeling_qwen3_vl_moe:Qwen3VLMoeTextSparseMoeBlock", always_renormalize=True,
                       config=_LOCAL_EXPERTS)
_QWEN3_5 = _qwen_like("qwen3_5_moe.modeling_qwen3_5_moe:Qwen3_5MoeSparseMoeBlock", shared=True,
                      always_renormalize=True)
_QWEN4_EXP = _qwen_like("qwen4_exp.modeling_qwen4_exp:Qwen4ExpTextSparseMoeBlock", shared=True)
_GLM4V = _deepseek_v3_like("glm4v_moe.modeling_glm4v_moe:Glm4vMoeTextMoE")
_ARIA = BlockDescriptor(block=_block("aria.modeling_aria:AriaTextMoELayer"), router=RouterDescriptor(weight="router.weight"),
                        routing=_TOPK_THEN_SOFTMAX_ROUTER, shared=_SHARED_EXPERTS,
                        config=ConfigFields(num_experts="moe_num_experts", intermediate_size="intermediate_size",
                                            paths=(("router.top_k", "moe_topk"),)))
_ERNIE_VL = Refused("the text MoE block routes text and image tokens to separate expert sets by a token-type "
                    "mask: not one top-k routed experts layer")
_MISTRAL_LARGE4 = BlockDescriptor(
    block=_block("mistral_large4.modeling_mistral_large4:MistralLarge4TextMoE"), router=_FP32_GATE,
    routing=RoutingDescriptor(top_k=At("gate.top_k"), renormalize=True, renormalize_eps=1e-20,
                              num_expert_groups=At("gate.num_group", 1), topk_groups=At("gate.topk_group", 1),
                              routed_scaling_factor=At("gate.routed_scaling_factor")),
    shared=_SHARED_EXPERTS, config=_ROUTED_EXPERTS,
    note="softmax scores of masked groups are filled with 0, not -inf: equal, as kept softmax scores are > 0")

_MINIMAX_M3_VL = BlockDescriptor(
    block=_block("minimax_m3_vl.modeling_minimax_m3_vl:MiniMaxM3VLSparseMoeBlock"), router=_GATE,
    routing=RoutingDescriptor(top_k=At("gate.top_k"), scoring=Scoring.SIGMOID, renormalize=True,
                              correction_bias="gate.e_score_correction_bias",
                              routed_scaling_factor=At("routed_scaling_factor")),
    shared=_SHARED_EXPERTS,
    activation=SwigluOAI(alpha=At("experts.swiglu_alpha"), limit=At("experts.swiglu_limit")),
    config=_LOCAL_EXPERTS_DENSE_WIDTH,
    note="gpt-oss's clamped SwiGLU on concatenated gate/up; routed output x routed_scaling_factor")

_INKLING2 = Refused("experts use a tanh soft-capped SwiGLU (softcap(gate) * sigmoid(gate) * softcap(up)): no "
                    "moe_core activation computes it")

_GLM5_NEXT = BlockDescriptor(
    block=_block("glm5_next.modeling_glm5_next:Glm5NextTextMoE"), router=_FP32_GATE, routing=_DEEPSEEK_V3,
    shared=_SHARED_EXPERTS, activation=ClampedSilu(limit=At("experts.swiglu_limit")), config=_ROUTED_EXPERTS,
    note="clamped SiLU experts (gate <= limit, -limit <= up <= limit)")
_QWEN3_OMNI_TALKER = _qwen_like("qwen3_omni_moe.modeling_qwen3_omni_moe:Qwen3OmniMoeTalkerTextSparseMoeBlock",
                                shared=True, config=_LOCAL_EXPERTS)
_BEAM = BlockDescriptor(
    block=_block("beam.modeling_beam:BeamMoE"), router=_FP32_GATE,
    routing=replace(_DEEPSEEK_V3, routed_scaling_factor=At("routed_scaling_factor")), config=_MOE_WIDTH,
    note="routed_scaling_factor multiplies the summed experts (equal to scaling each weight); SwiGLU in fp32")


def _deepseek_v2_like(block: str) -> BlockDescriptor:
    return BlockDescriptor(
        block=_block(block), router=_FP32_GATE,
        routing=RoutingDescriptor(
            top_k=At("gate.top_k"),
            num_expert_groups=Select("gate.topk_method", (("greedy", 1), ("group_limited_greedy", At("gate.num_group")))),
            topk_groups=Select("gate.topk_method", (("greedy", 1), ("group_limited_greedy", At("gate.topk_group")))),
            group_scoring=GroupScoring.MAX, routed_scaling_factor=At("gate.routed_scaling_factor")),
        shared=_SHARED_EXPERTS, config=_ROUTED_EXPERTS,
        note="group_limited_greedy scores a group by its best expert; masked softmax scores are 0 (kept ones > 0)")


_QWEN3_OMNI_THINKER = _qwen_like("qwen3_omni_moe.modeling_qwen3_omni_moe:Qwen3OmniMoeThinkerTextSparseMoeBlock")
_LLAMA4 = BlockDescriptor(
    block=_block("llama4.modeling_llama4:Llama4TextMoe"), router=RouterDescriptor(weight="router.weight"),
    routing=RoutingDescriptor(top_k=At("router.top_k"), scoring=Scoring.SIGMOID, weight_on_input=True),
    experts_layout=ExpertsLayout.TRANSPOSED_CONCATENATED, shared=SharedDescriptor(module="shared_expert"),
    router_output=("router", 1), flat_output=True, config=_LOCAL_EXPERTS_DENSE_WIDTH,
    note="top-1 on the logits, sigmoid weight applied to the expert's input; experts stored [E, K, 2N]")
_DEEPSEEK_OCR2 = _deepseek_v2_like("deepseek_ocr2.modeling_deepseek_ocr2:DeepseekOcr2TextMoe")
_UNLIMITED_OCR = _deepseek_v2_like("unlimited_ocr.modeling_unlimited_ocr:UnlimitedOcrTextMoe")

def _untested(why: str) -> Refused:
    """A block the descriptors could express but no parity test covers yet: refused, not guessed."""
    return Refused(f"not verified: no parity test covers it yet ({why}); its block looks expressible")


MODELS: dict[str, BlockDescriptor | Refused] = {
    # ---- softmax top-k (Mixtral / Qwen family) ----
    "mixtral": _MIXTRAL,
    "minimax": BlockDescriptor(block=_block("minimax.modeling_minimax:MiniMaxSparseMoeBlock"), router=_GATE,
                               routing=_SOFTMAX_RENORM, jitter_noise="jitter_noise",
                               config=_LOCAL_EXPERTS_DENSE_WIDTH),
    "qwen2_moe": _qwen_like("qwen2_moe.modeling_qwen2_moe:Qwen2MoeSparseMoeBlock", shared=True),
    "qwen3_moe": _qwen_like("qwen3_moe.modeling_qwen3_moe:Qwen3MoeSparseMoeBlock", config=_LOCAL_EXPERTS),
    "qwen3_next": _qwen_like("qwen3_next.modeling_qwen3_next:Qwen3NextSparseMoeBlock", shared=True),
    "qwen3_vl_moe": _QWEN3_VL,
    "qwen3_vl_moe_text": _QWEN3_VL,
    "qwen3_5_moe": _QWEN3_5,
    "qwen3_5_moe_text": _QWEN3_5,
    "qwen4_exp": _QWEN4_EXP,
    "qwen4_exp_text": _QWEN4_EXP,
    "olmoe": _qwen_like("olmoe.modeling_olmoe:OlmoeSparseMoeBlock", config=_DENSE_WIDTH),
    "mellum": _qwen_like("mellum.modeling_mellum:MellumSparseMoeBlock", config=_LOCAL_EXPERTS),
    "jamba": BlockDescriptor(block=_block("jamba.modeling_jamba:JambaSparseMoeBlock"),
                             router=RouterDescriptor(weight="router.weight"),
                             routing=RoutingDescriptor(top_k=At("router.top_k")), config=_DENSE_WIDTH),
    "gpt_oss": BlockDescriptor(block=_block("gpt_oss.modeling_gpt_oss:GptOssMLP"),
                               router=RouterDescriptor(weight="router.weight", bias="router.bias"),
                               routing=_TOPK_THEN_SOFTMAX_ROUTER, router_output=("router", 1),
                               activation=SwigluOAI(alpha=At("experts.alpha"), limit=At("experts.limit")),
                               config=ConfigFields(num_experts="num_local_experts", intermediate_size="intermediate_size",
                                                   has_bias=True),
                               note="gate/up rows interleaved; expert biases; clamped SwiGLU"),
    "aria": _ARIA,
    "aria_text": _ARIA,
    "granitemoe": _granite("granitemoe.modeling_granitemoe:GraniteMoeMoE"),
    "granitemoe_swa": _granite("granitemoe_swa.modeling_granitemoe_swa:GraniteMoeSWAMoE"),
    "granitemoehybrid": _granite("granitemoehybrid.modeling_granitemoehybrid:GraniteMoeHybridMoE"),
    "granitemoeshared": _granite("granitemoeshared.modeling_granitemoeshared:GraniteMoeSharedMoE"),
    "cohere2_moe": BlockDescriptor(
        block=_block("cohere2_moe.modeling_cohere2_moe:Cohere2MoeSparseMoeBlock"), router=_GATE,
        routing=RoutingDescriptor(
            top_k=At("gate.top_k"), scoring=Select("gate.expert_selection_fn", (("softmax", Scoring.SOFTMAX),
                                                                                 ("sigmoid", Scoring.SIGMOID))),
            renormalize=Select("gate.expert_selection_fn", (("softmax", True), ("sigmoid", At("gate.norm_topk_prob"))))),
        shared=SharedDescriptor(module="shared_experts", optional=True, combine_scale=Select(
            "shared_expert_combination_strategy", (("sum", 1.0), ("average", 0.5)))),
        config=_DENSE_WIDTH,
        note="sigmoid of the top-k logits = top-k of the sigmoid scores; 'average' halves routed + shared"),
    "ernie4_5_moe": BlockDescriptor(
        block=_block("ernie4_5_moe.modeling_ernie4_5_moe:Ernie4_5_MoeSparseMoeBlock"),
        router=RouterDescriptor(weight="gate.weight", fp32=True),
        routing=RoutingDescriptor(top_k=At("gate.top_k"), renormalize=True,
                                  correction_bias="gate.moe_statics.e_score_correction_bias"),
        shared=SharedDescriptor(module="shared_experts", optional=True),
        config=ConfigFields(num_experts="moe_num_experts", paths=(("gate.top_k", "moe_k"),)),
        note="weights / max(sum, moe_norm_min): the sum of k softmax scores is >= k/E, far above moe_norm_min"),
    "ernie4_5_vl_moe": _ERNIE_VL,
    "ernie4_5_vl_moe_text": _ERNIE_VL,
    # ---- sigmoid with a selection bias (DeepSeek-V3 family and its derivatives) ----
    "deepseek_v3": _deepseek_v3_like("deepseek_v3.modeling_deepseek_v3:DeepseekV3MoE"),
    "glm4_moe": _deepseek_v3_like("glm4_moe.modeling_glm4_moe:Glm4MoeMoE"),
    "glm4_moe_lite": _deepseek_v3_like("glm4_moe_lite.modeling_glm4_moe_lite:Glm4MoeLiteMoE"),
    "glm4v_moe": _GLM4V,
    "glm4v_moe_text": _GLM4V,
    "exaone_moe": _deepseek_v3_like("exaone_moe.modeling_exaone_moe:ExaoneMoeSparseMoEBlock", config=_MOE_WIDTH),
    "solar_open": _deepseek_v3_like("solar_open.modeling_solar_open:SolarOpenMoE"),
    "mimo_v2_flash": _deepseek_v3_like("mimo_v2_flash.modeling_mimo_v2_flash:MiMoV2FlashMoE", shared=False),
    "nemotron_h": BlockDescriptor(
        block=_block("nemotron_h.modeling_nemotron_h:NemotronHMoE"), router=_FP32_GATE, routing=_DEEPSEEK_V3,
        shared=_SHARED_EXPERTS,
        checks=(Check("fc1_latent_proj.__class__.__name__", ("Identity",),
                      "a latent projection around the experts (moe_latent_size) is not supported"),),
        config=ConfigFields(num_experts="n_routed_experts", hidden_act="mlp_hidden_act",
                            paths=(("fc1_latent_proj.__class__.__name__", Mapped("moe_latent_size", ((None, "Identity"),))),)),
        note="non-gated relu^2 experts"),
    "axk1": _deepseek_v3_like("axk1.modeling_axk1:AXK1MoE", post_module="post_mlp_layernorm"),
    "axk2": _deepseek_v3_like(
        "axk2.modeling_axk2:AXK2MoE",
        checks=(Check("gate.num_group", (None, 1), "grouped routing fills masked groups with 0, not -inf: with "
                      "a negative correction bias a masked expert can win, which moe_core does not express"),)),
    "deepseek_v2": _deepseek_v2_like("deepseek_v2.modeling_deepseek_v2:DeepseekV2Moe"),
    "mistral4": BlockDescriptor(
        block=_block("mistral4.modeling_mistral4:Mistral4MoE"), router=_GATE,
        routing=RoutingDescriptor(top_k=At("gate.top_k"), renormalize=At("gate.norm_topk_prob"), renormalize_eps=1e-20,
                                  num_expert_groups=At("gate.num_group", 1), topk_groups=At("gate.topk_group", 1),
                                  routed_scaling_factor=At("gate.routed_scaling_factor")),
        shared=_SHARED_EXPERTS, config=_ROUTED_EXPERTS,
        note="softmax scores of masked groups are filled with 0, not -inf: equal, as kept softmax scores are > 0"),
    "mistral_large4": _MISTRAL_LARGE4,
    "mistral_large4_text": _MISTRAL_LARGE4,
    "minimax_m2": BlockDescriptor(
        block=_block("minimax_m2.modeling_minimax_m2:MiniMaxM2SparseMoeBlock"), router=_GATE,
        routing=RoutingDescriptor(top_k=At("gate.top_k"), scoring=Scoring.SIGMOID, renormalize=True,
                                  correction_bias="e_score_correction_bias"),
        jitter_noise="jitter_noise", config=_LOCAL_EXPERTS_DENSE_WIDTH),
    "minimax_m3_vl": _MINIMAX_M3_VL,
    "minimax_m3_vl_text": _MINIMAX_M3_VL,
    "hy_v3": BlockDescriptor(
        block=_block("hy_v3.modeling_hy_v3:HYV3MoE"), router=_FP32_GATE,
        routing=RoutingDescriptor(top_k=At("gate.top_k"), scoring=Scoring.SIGMOID, renormalize=True,
                                  renormalize_eps=1e-20, correction_bias="e_score_correction_bias",
                                  routed_scaling_factor=At("gate.router_scaling_factor")),
        shared=_SHARED_EXPERTS, config=ConfigFields(paths=(("gate.router_scaling_factor", "router_scaling_factor"),)),
        note="enable_moe_fp32_combine adds routed and shared outputs in fp32: rounding only"),
    "kolibri1": BlockDescriptor(
        block=_block("kolibri1.modeling_kolibri1:Kolibri1SparseMoeBlock"), router=_FP32_GATE,
        routing=RoutingDescriptor(top_k=At("gate.top_k"), scoring=Scoring.SIGMOID,
                                  renormalize=At("gate.norm_topk_prob"), correction_bias="gate.e_score_correction_bias",
                                  correction_bias_on_logits=True),
        shared=_SHARED_EXPERTS, config=_LOCAL_EXPERTS, note="the selection bias is added to the logits, not the sigmoid scores"),
    "laguna": BlockDescriptor(
        block=_block("laguna.modeling_laguna:LagunaSparseMoeBlock"), router=_GATE,
        routing=RoutingDescriptor(top_k=At("gate.top_k"), scoring=Scoring.SIGMOID, renormalize=True,
                                  correction_bias="gate.e_score_correction_bias",
                                  routed_scaling_factor=At("routed_scaling_factor")),
        shared=_SHARED_EXPERTS,
        checks=(Check("gate.router_logit_softcapping", (0, 0.0, None),
                      "tanh soft-capping of the router logits is not supported"),),
        config=ConfigFields(paths=(("routed_scaling_factor", "moe_routed_scaling_factor"),
                                   ("gate.router_logit_softcapping", "moe_router_logit_softcapping")))),
    "afmoe": BlockDescriptor(
        block=_block("afmoe.modeling_afmoe:AfmoeSparseMoeBlock"),
        router=RouterDescriptor(weight="router.gate.weight", fp32=False),
        routing=RoutingDescriptor(top_k=At("router.top_k"), scoring=Scoring.SIGMOID, renormalize=True,
                                  renormalize_eps=1e-20, correction_bias="expert_bias",
                                  routed_scaling_factor=At("router.route_scale")),
        shared=_SHARED_EXPERTS, config=ConfigFields(paths=(("router.route_scale", "route_scale"),))),
    "inkling2": _INKLING2,
    "inkling2_text": _INKLING2,
    "dots1": _deepseek_v3_like("dots1.modeling_dots1:Dots1MoE"),
    "deepseek_v32": _deepseek_v3_like("deepseek_v32.modeling_deepseek_v32:DeepseekV32MoE"),
    "glm_moe_dsa": _deepseek_v3_like("glm_moe_dsa.modeling_glm_moe_dsa:GlmMoeDsaMoE"),
    "glm5_next": _GLM5_NEXT,
    "glm5_next_text": _GLM5_NEXT,
    "kimi_linear": _deepseek_v3_like("kimi_linear.modeling_kimi_linear:KimiLinearMoE", config=_BAILING_NAMES),
    "hy_v4": BlockDescriptor(block=_block("hy_v4.modeling_hy_v4:HYV4MoE"), router=_FP32_GATE, routing=_DEEPSEEK_V3,
                             shared=_SHARED_EXPERTS, activation=ClampedSilu(limit=At("experts.swiglu_limit")),
                             config=_ROUTED_EXPERTS,
                             note="clamped SiLU experts (gate <= limit, -limit <= up <= limit)"),
    "dots3_note_text": _deepseek_v3_like("dots3_note.modeling_dots3_note:Dots3NoteTextMoE"),
    "qwen3_omni_moe_thinker": _QWEN3_OMNI_THINKER,
    "qwen3_omni_moe_text": _QWEN3_OMNI_THINKER,
    "qwen3_omni_moe_talker_text": _QWEN3_OMNI_TALKER,
    "flint": BlockDescriptor(
        block=_block("flint.modeling_flint:FlintSparseMoeBlock"), router=_FP32_GATE,
        routing=RoutingDescriptor(top_k=At("gate.top_k"), scoring=Scoring.SIGMOID,
                                  renormalize=At("gate.norm_topk_prob")),
        shared=SharedDescriptor(module="shared_expert"), config=_MOE_WIDTH,
        note="sigmoid top-k without a bias; ungated shared expert"),
    "beam": _BEAM,
    "flex_olmo": _qwen_like("flex_olmo.modeling_flex_olmo:FlexOlmoSparseMoeBlock", config=_DENSE_WIDTH),
    "deepseek_ocr2": _untested("the multimodal wrapper's SAM and vision towers keep full size in the tiny "
                               "config (nested sub-configs) and are too slow to build on CPU; its text model "
                               "deepseek_ocr2_text is served"),
    "deepseek_ocr2_text": _DEEPSEEK_OCR2,
    "unlimited_ocr": _untested("the multimodal wrapper's SAM and vision towers keep full size in the tiny "
                               "config (nested sub-configs) and are too slow to build on CPU; its text model "
                               "unlimited_ocr_text is served"),
    "unlimited_ocr_text": _UNLIMITED_OCR,
    "lfm2_moe": BlockDescriptor(
        block=_block("lfm2_moe.modeling_lfm2_moe:Lfm2MoeSparseMoeBlock"), router=_GATE,
        routing=RoutingDescriptor(top_k=At("gate.top_k"), scoring=Scoring.SIGMOID,
                                  renormalize=At("gate.norm_topk_prob"), renormalize_eps=1e-6,
                                  correction_bias=Select("use_expert_bias", ((True, "expert_bias"), (False, None))),
                                  routed_scaling_factor=At("gate.routed_scaling_factor")),
        config=ConfigFields(hidden_act=Fixed("silu"))),
    "hunyuan_v1_moe": BlockDescriptor(
        block=_block("hunyuan_v1_moe.modeling_hunyuan_v1_moe:HunYuanMoEV1Moe"),
        router=RouterDescriptor(weight="gate.wg.weight"),
        routing=RoutingDescriptor(top_k=At("gate.top_k"), renormalize=True), shared=SharedDescriptor(module="shared_mlp"),
        config=ConfigFields(intermediate_size="intermediate_size", paths=(("gate.top_k", "moe_topk"),)),
        note="router kept in fp32 (logits in the router weight's dtype)"),
    "llama4": _LLAMA4,
    "llama4_text": _LLAMA4,
    "bailing_hybrid": _deepseek_v3_like("bailing_hybrid.modeling_bailing_hybrid:BailingHybridMoE", config=_BAILING_NAMES),
    # ---- refused: not top-k routed experts, or semantics moe_core does not express ----
    # ---- encoders and other parts of MoE models that have no MoE layers ----
    "deepseek_ocr2_encoder": Refused("vision encoder of deepseek_ocr2: no MoE layers", kind="no_moe"),
    "deepseek_ocr2_sam_vision_model": Refused("SAM vision model of deepseek_ocr2: no MoE layers", kind="no_moe"),
    "deepseek_ocr2_vision": Refused("vision tower of deepseek_ocr2: no MoE layers", kind="no_moe"),
    "dots3_note_audio_encoder": Refused("audio encoder of dots3_note: no MoE layers", kind="no_moe"),
    "ernie4_5_vl_moe_vision": Refused("vision encoder of ernie4_5_vl_moe: no MoE layers", kind="no_moe"),
    "gemma4_audio": Refused("audio encoder of gemma4: no MoE layers", kind="no_moe"),
    "gemma4_vision": Refused("vision encoder of gemma4: no MoE layers", kind="no_moe"),
    "glm4v_moe_vision": Refused("vision encoder of glm4v_moe: no MoE layers", kind="no_moe"),
    "glm5_next_vision": Refused("vision encoder of glm5_next: no MoE layers", kind="no_moe"),
    "inkling2_vision": Refused("vision encoder of inkling2: no MoE layers", kind="no_moe"),
    "inkling_audio": Refused("audio encoder of inkling: no MoE layers", kind="no_moe"),
    "inkling_vision": Refused("vision encoder of inkling: no MoE layers", kind="no_moe"),
    "minimax_m3_vl_vision": Refused("vision encoder of minimax_m3_vl: no MoE layers", kind="no_moe"),
    "muse_spark_audio": Refused("audio encoder of muse_spark: no MoE layers", kind="no_moe"),
    "muse_spark_vision": Refused("vision encoder of muse_spark: no MoE layers", kind="no_moe"),
    "qwen3_5_moe_vision": Refused("vision encoder of qwen3_5_moe: no MoE layers", kind="no_moe"),
    "qwen3_omni_moe_audio_encoder": Refused("audio encoder of qwen3_omni_moe: no MoE layers", kind="no_moe"),
    "qwen3_omni_moe_vision_encoder": Refused("vision encoder of qwen3_omni_moe: no MoE layers", kind="no_moe"),
    "qwen3_vl_moe_vision": Refused("vision encoder of qwen3_vl_moe: no MoE layers", kind="no_moe"),
    "qwen4_exp_vision": Refused("vision encoder of qwen4_exp: no MoE layers", kind="no_moe"),
    "step3p5_vision": Refused("vision encoder of step3p5: no MoE layers", kind="no_moe"),
    "unlimited_ocr_sam_vision_model": Refused("SAM vision model of unlimited_ocr: no MoE layers", kind="no_moe"),
    "unlimited_ocr_vision": Refused("vision tower of unlimited_ocr: no MoE layers", kind="no_moe"),
    "unlimited_ocr_vision_encoder": Refused("vision encoder of unlimited_ocr: no MoE layers", kind="no_moe"),
    "qwen3_omni_moe_talker_code_predictor": Refused("dense code predictor of the qwen3_omni_moe talker: no MoE layers", kind="no_moe"),
    "gemma4": Refused("the router normalizes and rescales its input and multiplies the weights by a per-expert scale, and the experts run inline in the decoder layer next to its dense MLP: no MoE block module to replace"),
    "gemma4_text": Refused("the router normalizes and rescales its input and multiplies the weights by a per-expert scale, and the experts run inline in the decoder layer next to its dense MLP: no MoE block module to replace"),
    "diffusion_gemma": Refused("Gemma 4 style MoE computed inline in the encoder/decoder layers (router input norm, per-expert scales): no MoE block module to replace"),
    "diffusion_gemma_text": Refused("Gemma 4 style MoE computed inline in the encoder/decoder layers (router input norm, per-expert scales): no MoE block module to replace"),
    "doge": Refused("cross-domain MoE (DogeCDMoE): product-key retrieval of single-neuron experts, not top-k routed MLP experts"),
    "dots3_note": Refused("two MoE block kinds in one model (text and vision experts with different routers); fuse the text model (dots3_note_text)"),
    "qwen3_omni_moe": Refused("two MoE block kinds in one model (thinker and talker); fuse the thinker (qwen3_omni_moe_thinker) or talker text model"),
    "inkling_mm_model": Refused("shared experts weighted by router-produced gammas (a logsigmoid softmax over routed and shared logits)"),
    "inkling_text": Refused("shared experts weighted by router-produced gammas (a logsigmoid softmax over routed and shared logits)"),
    "muse_spark_text": Refused("projection and centered RMS norm before the experts, a norm on each expert's output and a projection after: not one experts layer"),
    "kimi_k25": Refused("a multimodal wrapper whose language model is built from a remote-code config: no transformers MoE block class to match"),
    "nemotron_h_omni": Refused("multimodal wrapper of nemotron_h; fuse its language model (nemotron_h)"),
    "nemo_speechlm": Refused("speech model whose MoE language model is built from a sub-config at run time; fuse the language model itself"),
    "step3p5": Refused("clamped SiLU shared experts and per-layer swiglu limits with the clamp after the activation (silu(gate).clamp): moe_core clamps before the activation"),
    "step3p7": Refused("clamped SiLU with the clamp after the activation (silu(gate).clamp(max=limit)), per layer: moe_core clamps before the activation"),
    "dots3_note_vision_encoder": Refused("MoE layers inside a vision encoder, built from per-layer configs and fed "
                                         "image patches: fuse() serves language-model MoE blocks"),
    "openai_privacy_filter": Refused("router weights divided by top_k and the block output multiplied by "
                                     "num_experts: a block scale the descriptors cannot read from the model yet"),
    "switch_transformers": Refused("capacity-based top-1 router (expert_capacity) drops tokens over capacity: "
                                   "not top-k routing"),
    "nllb-moe": Refused("capacity-based top-2 router (expert_capacity, second-expert sampling policy) drops "
                        "tokens: not top-k routing"),
    "jetmoe": Refused("mixture of attention heads (MoA) and a top-k MLP router with bias on a non-standard "
                      "experts module (JetMoeMoE / JetMoeMoA): not a use_experts_implementation experts block"),
    "phimoe": Refused("sparsemixer routing: each next expert is chosen after masking by a jitter threshold "
                      "relative to the best logit, with weights from a masked softmax; not softmax/sigmoid top-k"),
    "deepseek_v4": Refused("hash routing in its first MoE layers: expert ids come from a token-id table "
                           "(tid2eid[input_ids]), not from the router scores"),
    "zaya": Refused("router MLP with state carried across layers (router_states) and a skip (identity) expert "
                    "chosen by softmax with balancing biases"),
    "muse_spark": Refused("projection and centered RMS norm before the experts, a norm on each expert's "
                          "output and a projection after: not expressible as one experts layer"),
    "longcat_flash": Refused("zero-computation (identity) experts mixed into the routed experts, on an experts "
                             "module without a declared layout"),
}
