#!/bin/sh
# Refreshes the seed corpora in fuzz/seeds/ from the reference policies in
# ../policies, so seeds follow the policies as they change. Run from anywhere.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
policies="$here/../policies"
seeds="$here/seeds"

rm -rf "$seeds/policy" "$seeds/data" "$seeds/request" "$seeds/scenario"
mkdir -p "$seeds/policy" "$seeds/data" "$seeds/expression" "$seeds/request" "$seeds/sse" "$seeds/provider_error" "$seeds/scenario"

# policy: every reference policy, as is.
for policy in "$policies"/*.policy; do
    cp "$policy" "$seeds/policy/"
done

# data: for each policy's directory, catalog.yaml, a 0 byte, tenants.yaml
# (the input format of fuzz_targets/data.rs).
for dir in "$policies"/*/; do
    name=$(basename "$dir")
    if [ -f "$dir/catalog.yaml" ] && [ -f "$dir/tenants.yaml" ]; then
        { cat "$dir/catalog.yaml"; printf '\0'; cat "$dir/tenants.yaml"; } > "$seeds/data/$name"
    fi
done
# JSON catalogs take the JSON reader (and the YAML one again on a mistake).
for catalog in "$here"/../tests/diagnostics/data/*.json; do
    { cat "$catalog"; printf '\0'; cat "$here/../tests/diagnostics/data/tenants.yaml"; } > "$seeds/data/$(basename "$catalog")"
done

# expression: a few hand-written expressions covering every construct
# (kept in the repository; only (re)written here when missing).
write_expr() {
    [ -f "$seeds/expression/$1" ] || printf '%s' "$2" > "$seeds/expression/$1"
}
write_expr durations '1.5s + 250ms - 5m * 2h / 1d'
write_expr percent '10% * route.price.input'
write_expr logic 'not a == b or c and d implies e'
write_expr compare 'a != b and c <= d and e >= f and g < h and i > j'
write_expr membership 'x not in [1, 2, 3] or "a\"b" in l'
write_expr call 'min(a, b, 3) + max(-a * b, 1)'
write_expr where 'min_of(cost where route.tier == "private")'
write_expr object '{ only: [it], allow_fallbacks: false, tag: null, on: true }'
write_expr if 'if present(route.price.input) then 3 * route.price.input + route.price.output else 0'
write_expr path 'input.provider.order'

# request: one seed per case of policies/*.tests.yaml, in the input format of
# fuzz_targets/request.rs (policy, endpoint, caller, seed, rotation, headers,
# the provider's answer from the case's `outcome`, then the body as JSON).
# Needs python3 with PyYAML (`pip install pyyaml`).
python3 - "$policies" "$seeds/request" <<'EOF'
import json, os, re, sys
try:
    import yaml
except ImportError:
    sys.exit("seed.sh: the request seeds need PyYAML (pip install pyyaml)")
policies_dir, out = sys.argv[1], sys.argv[2]
MAX_SEED_BYTES = 64 * 1024

# The orders of fuzz_targets/request.rs.
POLICIES = ["ai-setu", "anonrouter", "ngrok", "noeta", "noirdoc"]
ENDPOINTS = ["chat_completions", "completions", "embeddings", "responses", "messages"]
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages"]
HEADER_NAMES = ["x-ai-setu-provider-order", "x-anonrouter-e2ee", "x-anonrouter-ticket-provider",
                "authorization", "content-type", "x-request-id"]

def millis(text):
    """A duration such as `30s` or `1500ms` in milliseconds (0 if none)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*", str(text or ""))
    if not match:
        return 0
    return int(float(match.group(1)) * {"ms": 1, "s": 1000, "m": 60000, "h": 3600000}[match.group(2)])

def text(value):
    """An optional text: a length byte (0 for none, else length + 1), the bytes."""
    if value is None:
        return b"\0"
    value = str(value).encode()[:254]
    return bytes([len(value) + 1]) + value

def upstream(outcome):
    """The provider's answer: the case's `outcome`, else a 429 with
    Retry-After 2s and a rate-limit error."""
    if outcome is None:
        outcome = {"result": "429", "retry_after": "2s", "error_code": "rate_limit_exceeded",
                   "error_type": "rate_limit_error", "error_message": "slow down"}
    result = str(outcome.get("result", ""))
    status = int(result) if result.isdigit() and 100 <= int(result) <= 999 else 503
    data = (status - 100).to_bytes(2, "big")
    retry_after = millis(outcome.get("retry_after"))
    if outcome.get("retry_after") is None:
        data += b"\0"
    else:
        raw = retry_after.to_bytes(8, "big").lstrip(b"\0") or b"\0"
        data += bytes([len(raw)]) + raw
    for field in ("error_code", "error_type", "error_message"):
        data += text(outcome.get(field))
    data += bytes([min(int(outcome.get("retries", 0)), 255)])
    data += min(millis(outcome.get("elapsed")) // 100, 65535).to_bytes(2, "big")
    return data

written = 0
for p, name in enumerate(POLICIES):
    with open(os.path.join(policies_dir, name, "tenants.yaml")) as f:
        tenants = (yaml.safe_load(f) or {}).get("tenants") or []
    keys = [k["id"] for t in tenants for k in (t.get("keys") or [])]
    # Callers: the keys in file order, then every tenant's workspaces.
    callers = {}
    for t in tenants:
        workspaces = [w["id"] for w in (t.get("workspaces") or [])] or ["default"]
        for w in workspaces:
            callers[(t["id"], w)] = len(keys) + len(callers)
    with open(os.path.join(policies_dir, name + ".tests.yaml")) as f:
        cases = (yaml.safe_load(f) or {}).get("cases") or []
    for number, case in enumerate(cases):
        endpoint = case.get("endpoint", "chat_completions")
        e = ENDPOINTS.index(endpoint) if endpoint in ENDPOINTS else PATHS.index(endpoint) if endpoint in PATHS else 0
        if case.get("key") in keys:
            caller = keys.index(case["key"])
        elif case.get("tenant"):
            first = next((w for (t, w) in callers if t == case["tenant"]), "default")
            caller = callers.get((case["tenant"], case.get("workspace") or first), 0)
        else:
            caller = 0
        headers = [(HEADER_NAMES.index(n.lower()), str(v).encode()[:255])
                   for n, v in (case.get("headers") or {}).items() if n.lower() in HEADER_NAMES][:3]
        data = bytes([p, e, caller % 256, int(case.get("seed", 0)) % 256, 0, len(headers)])
        for index, value in headers:
            data += bytes([index, len(value)]) + value
        data += upstream(case.get("outcome"))
        data += json.dumps(case.get("body"), default=str, separators=(",", ":")).encode()
        # Cases with huge bodies (context-length rules) would set libFuzzer's
        # -max_len to their size and slow every run; the small ones cover
        # the same code.
        if len(data) > MAX_SEED_BYTES:
            continue
        with open(os.path.join(out, "%s-%03d" % (name, number)), "wb") as f:
            f.write(data)
        written += 1
EOF

# sse: hand-written provider streams (kept in the repository; only
# (re)written here when missing). The first byte is the endpoint (0 chat
# completions, 1 completions, 2 embeddings, 3 responses, 4 messages); each
# 0xFF byte cuts the stream into the chunks given to EventReader::push.
python3 - "$seeds/sse" <<'EOF'
import json, os, sys
out = sys.argv[1]
CUT = b"\xff"
def data(obj):
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
def named(name, obj):
    return b"event: " + name.encode() + b"\n" + data(obj)
def chat_chunk(delta, finish=None, usage=None, choices=True):
    obj = {"id": "chatcmpl-9x", "object": "chat.completion.chunk", "created": 1764460800,
           "model": "gpt-4.1-2025-04-14", "system_fingerprint": "fp_1",
           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}] if choices else []}
    if usage is not None:
        obj["usage"] = usage
    return data(obj)
chat = (chat_chunk({"role": "assistant", "content": "", "refusal": None})
        + chat_chunk({"content": "Hello"}) + chat_chunk({"content": " there"})
        + chat_chunk({}, "stop")
        + chat_chunk(None, usage={"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}, choices=False)
        + b"data: [DONE]\n\n")
def completion(text, finish=None):
    return data({"id": "cmpl-1", "object": "text_completion", "created": 1764460800, "model": "gpt-3.5-turbo-instruct",
                 "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]})
completions = completion("Once") + completion(" upon") + completion("", "length") + b"data: [DONE]\n\n"
response = {"id": "resp_1", "object": "response", "created_at": 1764460800, "status": "in_progress",
            "model": "gpt-5", "output": [], "usage": None}
done = dict(response, status="completed",
            output=[{"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
                     "content": [{"type": "output_text", "text": "Hi!", "annotations": []}]}],
            usage={"input_tokens": 9, "output_tokens": 2, "total_tokens": 11})
responses = (named("response.created", {"type": "response.created", "sequence_number": 0, "response": response})
             + named("response.in_progress", {"type": "response.in_progress", "sequence_number": 1, "response": response})
             + named("response.output_item.added", {"type": "response.output_item.added", "sequence_number": 2, "output_index": 0,
                     "item": {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}})
             + named("response.content_part.added", {"type": "response.content_part.added", "sequence_number": 3, "item_id": "msg_1",
                     "output_index": 0, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
             + named("response.output_text.delta", {"type": "response.output_text.delta", "sequence_number": 4, "item_id": "msg_1",
                     "output_index": 0, "content_index": 0, "delta": "Hi!"})
             + named("response.output_text.done", {"type": "response.output_text.done", "sequence_number": 5, "item_id": "msg_1",
                     "output_index": 0, "content_index": 0, "text": "Hi!"})
             + named("response.completed", {"type": "response.completed", "sequence_number": 6, "response": done}))
responses_failed = (named("response.created", {"type": "response.created", "sequence_number": 0, "response": response})
                    + named("response.failed", {"type": "response.failed", "sequence_number": 1,
                            "response": dict(response, status="failed", error={"code": "server_error", "message": "boom"})}))
message = {"id": "msg_01", "type": "message", "role": "assistant", "content": [], "model": "claude-sonnet-4-5",
           "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 25, "output_tokens": 1}}
messages = (named("message_start", {"type": "message_start", "message": message})
            + named("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            + named("ping", {"type": "ping"})
            + named("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}})
            + named("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "!"}})
            + named("content_block_stop", {"type": "content_block_stop", "index": 0})
            + named("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 15}})
            + named("message_stop", {"type": "message_stop"}))
messages_error = (named("message_start", {"type": "message_start", "message": message})
                  + named("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}))
seeds = {
    "chat": b"\x00" + chat,
    # Cut inside "data:", inside the JSON, between the two newlines of a
    # blank line, and inside [DONE].
    "chat-cuts": b"\x00" + chat[:3] + CUT + chat[3:40] + CUT + chat[40:chat.index(b"\n\n") + 1] + CUT
                 + chat[chat.index(b"\n\n") + 1:-8] + CUT + chat[-8:],
    "chat-one-byte-chunks": b"\x00" + CUT.join(bytes([b]) for b in chat[:200]),
    "chat-crlf-keepalive": b"\x00" + b": OPENROUTER PROCESSING\r\n\r\n"
                           + chat.replace(b"\n", b"\r\n")[:-4] + CUT + b"\r\n\r\n",
    "chat-error-mid-stream": b"\x00" + chat_chunk({"content": "Hel"})
                             + data({"error": {"message": "upstream overloaded", "type": "server_error", "code": 503}}),
    "chat-truncated": b"\x00" + chat[:-20],
    "completions": b"\x01" + completions,
    "embeddings": b"\x02" + data({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, -0.2]}]}),
    "responses": b"\x03" + responses,
    "responses-failed": b"\x03" + responses_failed,
    "messages": b"\x04" + messages,
    "messages-cuts": b"\x04" + messages[:7] + CUT + messages[7:120] + CUT + messages[120:],
    "messages-error": b"\x04" + messages_error,
    "messages-done-sentinel": b"\x04" + b"data: [DONE]\n\n",
}
for name, content in seeds.items():
    path = os.path.join(out, name)
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(content)
EOF

# provider_error: a secret, a status and an error body echoing the secret
# as JSON encoders write it (PHP's `\/`, .NET's `\u` escapes, an error
# object sent on as a string, a body cut inside the key). Byte 0 is the
# secret's length less 12, then its characters as indexes into the target's
# KEY_CHARACTERS, then the status less 400.
python3 - "$seeds/provider_error" <<'EOF'
import os, sys
out = sys.argv[1]
KEY = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_/+."
secret = b"sk-aki/secret+KEY/0123456789abcdef"
head = bytes([len(secret) - 12]) + bytes(KEY.index(c) for c in secret)
def escaped(text, table):
    return b"".join(table.get(bytes([c]), bytes([c])) for c in text)
php = escaped(secret, {b"/": b"\\/"})
dotnet = escaped(secret, {b"-": b"\\u002D", b"+": b"\\u002B"})
seeds = {
    "verbatim": (1, b'{"error":{"message":"Incorrect API key provided: ' + secret + b'","code":"invalid_api_key"}}'),
    "php": (1, b'{"error":{"message":"Incorrect API key provided: ' + php + b'","code":"invalid_api_key"}}'),
    "dotnet": (3, b'{"type":"error","error":{"type":"permission_error","message":"bad key ' + dotnet + b'"}}'),
    "double": (102, b'{"detail":"{\\"error\\":\\"bad key ' + escaped(secret, {b"/": b"\\\\\\/"}) + b'\\"}"}'),
    "cut": (29, b'{"error":{"message":"rate limited for ' + php[:20] + b'\\u00'),
    "text": (100, b'upstream said 5" screen: key ' + php + b' rejected'),
}
for name, (status, body) in seeds.items():
    path = os.path.join(out, name)
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(head + bytes([status]) + body)
EOF

# scenario: the shipped scenarios, the example of docs/sim.md, and the step
# examples of docs/sim.md, one per line (the target also parses each line as
# a step on its own).
for scenario in "$here"/../scenarios/*.yaml; do
    cp "$scenario" "$seeds/scenario/"
done
awk '/^```yaml$/ { inside = 1; next } /^```$/ { inside = 0 } inside' "$here/../docs/sim.md" > "$seeds/scenario/sim-md-example.yaml"
cat > "$seeds/scenario/steps" <<'EOF'
429 retry_after=2s code=rate_limit_exceeded
503 message="down for maintenance"
200 first_token=3s
cut_after=3 first_token=100ms
malformed_chunk=2 no_done
reset slow_headers=1.5s
no_answer
malformed first_token=250ms
200 stall_after=2
error_after=2 code=max_tokens_exceeded message="out of room"
529 retry_after=1500ms code=overloaded_error message="try \"again\" \\ later"
EOF
cat > "$seeds/scenario/inline" <<'EOF'
defaults: {latency: 20ms, chunks: 3, usage: {input: 1, output: 2}}
providers:
  a:
    latency: 50ms
    sequence: ["503", 200, reset, "429 retry_after=2s"]
    models:
      m: {chunks: 7, sequence: [reset, 429], repeat: true}
      n:
  b:
EOF

echo "seeds: $(ls "$seeds/policy" | wc -l) policy, $(ls "$seeds/data" | wc -l) data, $(ls "$seeds/expression" | wc -l) expression, $(ls "$seeds/request" | wc -l) request, $(ls "$seeds/sse" | wc -l) sse, $(ls "$seeds/provider_error" | wc -l) provider_error, $(ls "$seeds/scenario" | wc -l) scenario"
