"""Drives an mmrouter proxy with the official `openai` SDK (run by tests/openai_sdk.rs).

Reads a JSON job from stdin ({"base_url", "model", "text_messages", "image_messages",
"too_large_bytes"}) and prints one JSON summary on stdout. It records what the SDK saw rather than
asserting, so the Rust test reports every mismatch with the values at hand. An exception the SDK
raises where none was expected propagates: a non-zero exit with the traceback on stderr.
"""

import json
import sys

import openai
from openai import OpenAI


def header(raw, name):
    return raw.headers.get(name)


def plain_chat(client, model, messages):
    raw = client.chat.completions.with_raw_response.create(model=model, messages=messages, max_tokens=8)
    r = raw.parse()
    choice = r.choices[0]
    return {
        "status": raw.status_code,
        "route": header(raw, "x-mmrouter-route"),
        "worker": header(raw, "x-mmrouter-worker"),
        "object": r.object,
        "content": choice.message.content,
        "finish_reason": choice.finish_reason,
        "prompt_tokens": r.usage.prompt_tokens if r.usage else None,
        "completion_tokens": r.usage.completion_tokens if r.usage else None,
    }


def stream_chat(client, model, messages):
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=messages,
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = content_chunks = usage_chunks = 0
    content = ""
    finish_reason = None
    prompt_tokens = completion_tokens = None
    for chunk in raw.parse():
        chunks += 1
        for choice in chunk.choices:
            if choice.delta and choice.delta.content:
                content_chunks += 1
                content += choice.delta.content
            if choice.finish_reason:
                finish_reason = choice.finish_reason
        if chunk.usage is not None:
            usage_chunks += 1
            prompt_tokens = chunk.usage.prompt_tokens
            completion_tokens = chunk.usage.completion_tokens
    return {
        "status": raw.status_code,
        "route": header(raw, "x-mmrouter-route"),
        "content_type": header(raw, "content-type"),
        "chunks": chunks,
        "content_chunks": content_chunks,
        "content": content,
        "finish_reason": finish_reason,
        "usage_chunks": usage_chunks,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
    }


def expect_error(call):
    """Runs `call`, which must raise an API status error; returns what the SDK exposed."""
    try:
        call()
    except openai.APIStatusError as e:
        return {
            "exception": type(e).__name__,
            "status": e.status_code,
            "code": e.code,
            "type": e.type,
            "message": e.message,
            "error_header": e.response.headers.get("x-mmrouter-error"),
        }
    return {"exception": None}


def responses_conversation(client, model, text):
    """A Responses conversation: a first turn, a follow-up by `previous_response_id`, a streamed
    follow-up of that, then `responses.retrieve` of the first."""
    raw = client.responses.with_raw_response.create(model=model, input=text, max_output_tokens=8)
    first = raw.parse()
    out = {
        "first": {
            "status": raw.status_code,
            "worker": header(raw, "x-mmrouter-worker"),
            "id": first.id,
            "object": first.object,
            "text": first.output_text,
            "input_tokens": first.usage.input_tokens if first.usage else None,
        }
    }
    raw = client.responses.with_raw_response.create(
        model=model, input="And then?", previous_response_id=first.id, max_output_tokens=8
    )
    follow = raw.parse()
    out["follow_up"] = {
        "status": raw.status_code,
        "worker": header(raw, "x-mmrouter-worker"),
        "pinned": header(raw, "x-mmrouter-pinned"),
        "id": follow.id,
        "previous_response_id": follow.previous_response_id,
        "input_tokens": follow.usage.input_tokens if follow.usage else None,
    }
    raw = client.responses.with_raw_response.create(
        model=model, input="Once more.", previous_response_id=follow.id, max_output_tokens=8, stream=True
    )
    types, completed = [], None
    for event in raw.parse():
        types.append(event.type)
        if event.type == "response.completed":
            completed = event.response
    out["stream"] = {
        "status": raw.status_code,
        "worker": header(raw, "x-mmrouter-worker"),
        "pinned": header(raw, "x-mmrouter-pinned"),
        "first_event": types[0] if types else None,
        "previous_response_id": completed.previous_response_id if completed else None,
    }
    got = client.responses.retrieve(first.id)
    out["retrieve"] = {"id": got.id, "status": got.status}
    out["unknown"] = expect_error(
        lambda: client.responses.create(
            model=model, input="Hi", previous_response_id="resp_0000000000000000", max_output_tokens=8
        )
    )
    return out


def main():
    job = json.load(sys.stdin)
    client = OpenAI(base_url=job["base_url"] + "/v1", api_key="x", max_retries=0, timeout=30.0)
    model = job["model"]
    out = {"sdk_version": openai.__version__}
    out["text"] = plain_chat(client, model, job["text_messages"])
    out["stream"] = stream_chat(client, model, job["text_messages"])
    out["image"] = plain_chat(client, model, job["image_messages"])
    # The SDK only sends valid JSON; a JSON array through the low-level `post` reaches the proxy's own
    # 400 (the body must be an object) without any transport trickery.
    out["bad_request"] = expect_error(
        lambda: client.post("/chat/completions", cast_to=object, body=[{"model": model}])
    )
    big = [{"role": "user", "content": "x" * job["too_large_bytes"]}]
    out["too_large"] = expect_error(
        lambda: client.chat.completions.create(model=model, messages=big, max_tokens=1)
    )
    # models.retrieve: GET /v1/models/{id}, answered by the router (vLLM answers it 404).
    m = client.models.retrieve(model)
    out["retrieve"] = {"id": m.id, "object": m.object}
    out["retrieve_unknown"] = expect_error(lambda: client.models.retrieve("no-such-model"))
    out["responses"] = responses_conversation(client, model, "Say hello in three words.")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
