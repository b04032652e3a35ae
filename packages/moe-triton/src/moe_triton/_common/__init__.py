"""Helpers every kernel family shares: the target probe (`target`), programmatic dependent launch
(`pdl`), the expert activation (`activation`), the Gluon pieces both Hopper wgmma GEMMs use
(`wgmma`) and offline sm_90 compilation (`offline_compile`)."""
