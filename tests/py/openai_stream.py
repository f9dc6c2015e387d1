"""Stream a chat completion through Pronto with the real OpenAI Python SDK.

Usage: python3 openai_stream.py BASE_URL MODEL
Prints the streamed text on one line, then `CHUNKS n`, then what the non-streamed call,
the models list, models.retrieve and a request id round trip gave. Exits non-zero on any
error.
"""
import sys

import openai
from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="test-key", max_retries=0, timeout=30)
stream = client.chat.completions.create(
    model=model,
    messages=[
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Say something."},
    ],
    max_tokens=5,
    stream=True,
)
text, chunks = "", 0
for chunk in stream:
    chunks += 1
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
print(text)
print(f"CHUNKS {chunks}")

# Non-streaming too, and the models list the gateway answers itself.
resp = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3
)
print("NONSTREAM", resp.choices[0].message.content)
print("MODELS", ",".join(m.id for m in client.models.list()))

# models.retrieve: the model the gateway serves, and a 404 for one it does not.
m = client.models.retrieve(model)
print("RETRIEVE", m.id, m.object)
try:
    client.models.retrieve("no-such-model")
    print("RETRIEVE no-such-model: no error")
except openai.NotFoundError as e:
    print("MISSING", e.status_code, e.body["code"] if isinstance(e.body, dict) else e.body)

# Every answer carries a request id; one the client gives comes back.
raw = client.chat.completions.with_raw_response.create(
    model=model,
    messages=[{"role": "user", "content": "hi"}],
    max_tokens=3,
    extra_headers={"x-request-id": "sdk-request-1"},
)
print("REQUEST_ID", raw.headers.get("x-request-id"))
