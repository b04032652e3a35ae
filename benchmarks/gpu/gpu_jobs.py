"""Run a list of GPU jobs over every visible GPU (those CUDA_VISIBLE_DEVICES names when it is set, so
two lists can share a machine): one worker per GPU takes the next job in list order
(so put the longest first), runs it with CUDA_VISIBLE_DEVICES set to its GPU, and stops taking jobs
at the deadline; a running job is stopped there too (what it already wrote stays).

    python3 gpu_jobs.py JOBS_FILE --out DIR --deadline-s SECONDS

JOBS_FILE: one job per line, `name<TAB>shell command` (blank lines and # comments skipped). Each
job's output goes to DIR/NAME.log; DIR/jobs.json lists every job's GPU, exit status, seconds, or
that the deadline left it unstarted. Exit status 1 when a job failed or did not run.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path


def visible_gpus() -> list[str]:
    named = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if named:
        return [gpu.strip() for gpu in named.split(",")]
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=True).stdout
    return [str(i) for i, line in enumerate(listed.splitlines()) if line.startswith("GPU ")]


def read_jobs(path: Path) -> list[tuple[str, str]]:
    jobs = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, sep, command = line.partition("\t")
            if not sep or not command.strip():
                raise SystemExit(f"{path}: expected 'name<TAB>command', got {line!r}")
            jobs.append((name.strip(), command))
    names = [name for name, _ in jobs]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path}: job names must be unique")
    return jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, required=True, help="seconds from now")
    args = parser.parse_args()
    deadline = time.monotonic() + args.deadline_s
    args.out.mkdir(parents=True, exist_ok=True)
    pending: queue.Queue[tuple[str, str]] = queue.Queue()
    for job in read_jobs(args.jobs):
        pending.put(job)
    results: dict[str, dict] = {}
    lock = threading.Lock()

    def work(gpu: str) -> None:
        while True:
            left = deadline - time.monotonic()
            if left <= 1:
                return
            try:
                name, command = pending.get_nowait()
            except queue.Empty:
                return
            start = time.monotonic()
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu}
            with open(args.out / f"{name}.log", "w") as log:
                proc = subprocess.Popen(["bash", "-c", command], stdout=log, stderr=subprocess.STDOUT, env=env,
                                        start_new_session=True)
                try:
                    rc = proc.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, 15)
                    rc = "deadline"
                    proc.wait()
            seconds = round(time.monotonic() - start, 1)
            with lock:
                results[name] = {"gpu": gpu, "exit": rc, "seconds": seconds}
                print(f"[gpu {gpu}] {name}: exit {rc} after {seconds}s", flush=True)

    threads = [threading.Thread(target=work, args=(gpu,)) for gpu in visible_gpus()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while not pending.empty():
        name, _ = pending.get_nowait()
        results[name] = {"exit": "not started (deadline)"}
        print(f"{name}: not started (deadline)", flush=True)
    (args.out / "jobs.json").write_text(json.dumps(results, indent=1))
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
