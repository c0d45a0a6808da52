"""The OpenAI SDK's `client.responses.create` through the router (run by tests/engine/responses.rs with
the vLLM venv's python, which has `openai`).

argv[1]: a JSON job {"base_url", "model", "input"}. Prints one JSON summary on stdout of a plain
response, a streamed one and a follow-up by `previous_response_id`, each with the worker the router
named; the Rust test asserts on it. An SDK exception propagates (non-zero exit, traceback on stderr).
"""

import json
import sys

from openai import OpenAI


def summary(r, worker):
    return {
        "object": r.object,
        "id": r.id,
        "status": r.status,
        "previous_response_id": r.previous_response_id,
        "input_tokens": r.usage.input_tokens if r.usage else None,
        "text": r.output_text,
        "worker": worker,
    }


def main():
    job = json.loads(sys.argv[1])
    client = OpenAI(base_url=job["base_url"], api_key="unused", max_retries=0, timeout=120)
    model = job["model"]
    raw = client.responses.with_raw_response.create(model=model, input=job["input"], max_output_tokens=4)
    first = raw.parse()
    out = {"first": summary(first, raw.headers.get("x-mmrouter-worker"))}

    completed = None
    with client.responses.stream(model=model, input=job["input"] + " Again.", max_output_tokens=4) as stream:
        for event in stream:
            if event.type == "response.completed":
                completed = event.response
    out["streamed"] = summary(completed, None)

    raw = client.responses.with_raw_response.create(
        model=model, input="And one more?", previous_response_id=first.id, max_output_tokens=4
    )
    out["follow_up"] = summary(raw.parse(), raw.headers.get("x-mmrouter-worker"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
