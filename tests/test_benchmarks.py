"""The GPU benchmarks' CPU smoke tests: each script's --dry-run runs every section and writes sane records."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_h100_e2e_dry_run(tmp_path: Path) -> None:
    "h100_e2e.py --dry-run: every section ok, the static step equals forward, the engine's greedy runs are exact."
    out = tmp_path / "h100"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "h100_e2e.py"), "--dry-run", "--out", str(out)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((out / "results.json").read_text())
    meta, sections = res["meta"], res["sections"]
    names = ["bandwidth", "decode", "draft", "verify", "batch", "engine"]
    assert list(sections) == names
    assert all(sections[n]["status"] == "ok" and sections[n]["records"] for n in names), \
        {n: sections[n]["status"] for n in names}
    md = (out / "results.md").read_text()
    assert all(f"## {n}: ok" in md for n in names)
    assert meta["dry_run"] and meta["dtype"] == "fp32" and meta["weights"] == "random"
    assert meta["step_parity"] < 1e-4                       # the static step's math is speclab.model's

    assert sections["bandwidth"]["records"][0]["GBps"] > 0
    decode, draft = sections["decode"]["records"][0], sections["draft"]["records"][0]
    assert (decode["model"], draft["model"]) == ("tiny-2l", "tiny-1l")
    assert all(x["ms"] > 0 and x["floor_ms"] > 0 and x["mode"] == "eager" for x in (decode, draft))
    assert meta["c_measured"] == round(draft["ms"] / decode["ms"], 4)

    kappa = meta["kappa"]
    verify = sections["verify"]["records"]
    Ts = [x["T"] for x in verify]
    assert Ts == sorted(Ts) and 1 in Ts and kappa + 1 in Ts and verify[0]["cost"] == 1.0
    assert meta["v_measured"] == next(x["cost"] for x in verify if x["T"] == kappa + 1)

    batch = sections["batch"]["records"]
    assert [x["B"] for x in batch] == [1, 2, 4]
    E_model = (1 - meta["alpha"] ** (kappa + 1)) / (1 - meta["alpha"])
    for x in batch:
        assert abs(x["spec_ms"] - (kappa * x["draft_ms"] + x["verify_ms"])) < 1e-3
        assert abs(x["speedup"] - E_model * x["plain_ms"] / x["spec_ms"]) < 1e-2

    engine = sections["engine"]["records"]
    assert {(x["B"], x["run"]) for x in engine} == {(1, "synthetic"), (1, "draft"), (1, "self"), (4, "synthetic"),
                                                    (4, "draft")}
    for x in engine:
        assert x["forward"] == "eager" and x["new_tokens"] == meta["engine_tokens"]
        assert x["plain_tok_s"] > 0 and x["spec_tok_s"] > 0
        assert abs(x["speedup"] - x["spec_tok_s"] / x["plain_tok_s"]) < 1e-2
        assert 1 <= x["E"] <= kappa + 1
        assert x["spec_steps"] < x["plain_steps"] or x["E"] < 1.5   # E > 1 means fewer steps than one per token
        assert abs(x["draft_share"] + x["target_share"] + x["other_share"] - 1) < 1e-2
        assert x["draft_share"] > 0 and x["target_share"] > 0
        c = 1.0 if x["run"] == "self" else meta["c_measured"]
        assert abs(x["predicted"] - x["E"] / (meta["v_measured"] + kappa * c)) < 1e-2
    exact = [x for x in engine if x["sampler"] == "rejection_sampler"]
    assert exact and all(x["outputs_match"] == 1.0 and x["prefix_match"] == 1.0 for x in exact)   # = plain decoding
    assert all(x["sampler"].startswith("SyntheticSampler") and x["outputs_match"] is None
               for x in engine if x["run"] == "synthetic")
    self_draft = next(x for x in engine if x["run"] == "self")
    assert self_draft["acceptance_rate"] > 0.9 and self_draft["E"] > 1 + 0.9 * kappa   # the target agrees with itself
    assert next(x for x in engine if x["run"] == "draft" and x["B"] == 4)["predicted_at_B"] is not None
    assert meta["compile"] == dict(requested=False, mode=None, status="not requested")


def test_serve_load_smoke() -> None:
    "serve_load.py at a small size: 8 streamed requests against a running limit of 2 all complete, nothing lost."
    cmd = [sys.executable, str(ROOT / "benchmarks" / "serve_load.py"), "--requests", "8", "--max-num-seqs", "2",
           "--min-tokens", "9", "--max-tokens", "16", "--json", "--timeout", "300"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    report = json.loads(r.stdout)
    assert all(report["checks"].values()) and report["checks"], report["checks"]
    assert report["output_tokens"] == sum(range(9, 17)) and report["most_waiting_seen"] > 0
    assert report["ttft_s_p50"] <= report["latency_s_p99"] and report["E"] >= 1
