"""Schema fuzzing in CI: schemathesis against `speclab serve`'s own OpenAPI schema (`app.openapi()`).

Every operation of the schema gets a bounded, derandomized budget of generated requests, valid and invalid (positive
and negative generation modes), sent over HTTP to a live server on the shipped tiny pair. Each answer must not be a
5xx, must have a status code, content type and JSON body the schema declares for it, an invalid request must be
refused with a 4xx, and every 4xx must name the field at fault (`error.param`, a path such as `stream_options.foo`,
or `body` for a body that is not a JSON object). What the fuzzer found is kept as plain regression tests in
tests/test_serve.py (`test_errors`, `test_fuzz_findings`). A valid max_tokens above 64 is lowered to 64 before a
request is sent, so that the budget is spent on many requests rather than on a few long ones.
"""
from collections import Counter

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance, negative_data_rejection,
                                               response_schema_conformance, status_code_conformance)

from speclab.serve import EngineLoop, ServerThread, build_app, load_engine
from speclab.train import tiny_pair_path

pytestmark = pytest.mark.xdist_group("schema_fuzz")   # one worker: one server for the module

MODEL = "speclab-tiny"
EXAMPLES = 80                     # per operation and generation mode: the file's budget (about a minute, 2 cores)
MAX_TOKENS = 64                     # a valid max_tokens above this is lowered to it: time (about 7 ms a token here)
SEEN = Counter()                    # (operation, status) of every answer, for the check that the fuzz got through


@pytest.fixture(scope="module")
def live():
    "(url, app) of a server on the shipped pair, kappa 3, at most 4 running requests."
    engine = load_engine(tiny_pair_path("target"), tiny_pair_path("draft"), kappa=3, max_num_seqs=4)
    app = build_app(EngineLoop(engine), MODEL)
    with ServerThread(app) as srv:
        yield srv.url, app


@pytest.fixture
def api(live):
    "The server's own schema, as FastAPI writes it, with a bounded and deterministic example budget."
    url, app = live
    schema = schemathesis.openapi.from_dict(app.openapi())
    schema.config.update(base_url=url)
    schema.config.generation.update(max_examples=EXAMPLES, deterministic=True, database="none")
    return schema


def names_the_field(ctx, response, case) -> None:
    """A 4xx is OpenAI's error object whose `param` names the field at fault, and its message says which; a method
    the route does not take (405: no field is at fault) says the method instead."""
    if not 400 <= response.status_code < 500:
        return None
    err = response.json()["error"]
    if response.status_code == 405:
        assert err["param"] is None and err["message"].startswith(f"{case.method.upper()} "), err
        return None
    assert isinstance(err.get("param"), str) and err["param"], f"a {response.status_code} names no field: {err}"
    head = err["param"].split(".")[0]
    assert head in err["message"] or (head == "body" and "body" in err["message"]), err
    return None


def lower_max_tokens(body) -> None:
    """Cap what a served request may cost: a valid max_tokens (or max_completion_tokens) above MAX_TOKENS becomes
    MAX_TOKENS. Out-of-range values are left as generated, so their refusals are still tested."""
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name) if isinstance(body, dict) else None
        if type(value) in (int, float) and MAX_TOKENS < value < 512 and value == int(value):
            body[name] = MAX_TOKENS


schema = schemathesis.pytest.from_fixture("api")


@schema.parametrize()
@settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=True,
          suppress_health_check=list(HealthCheck))
def test_the_server_keeps_its_schema(case, live):
    "No 5xx; the declared status codes, content types and bodies; invalid data refused; every 4xx names its field."
    lower_max_tokens(case.body)
    response = case.call(base_url=live[0], timeout=120)
    SEEN[f"{case.method.upper()} {case.path}", response.status_code] += 1
    case.validate_response(response, checks=[not_a_server_error, status_code_conformance, content_type_conformance,
                                              response_schema_conformance, negative_data_rejection, names_the_field])


def test_the_fuzz_reached_the_engine():
    "Not only refusals: generated requests were served (200) on every operation, completions included."
    print("\n" + "\n".join(f"{op} {status}: {n}" for (op, status), n in sorted(SEEN.items())))
    served = {op for (op, status) in SEEN if status == 200}
    assert {"GET /health", "GET /v1/models", "GET /metrics", "POST /v1/completions"} <= served, SEEN
    assert any(op == "POST /v1/chat/completions" and status == 400 for op, status in SEEN)   # no template: refused
