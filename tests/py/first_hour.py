"""A new user's first chat through Pronto, with the real OpenAI Python SDK.

Usage: python3 first_hour.py BASE_URL MODEL
Prints what the answers say: the models listed, then for a non-streamed and a streamed chat
the `model` of the answer (every distinct one, for the stream's chunks) and its text.
Exits non-zero on any error.
"""
import sys

from openai import OpenAI

base_url, model = sys.argv[1], sys.argv[2]
client = OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=30)
print("MODELS", ",".join(m.id for m in client.models.list()))

messages = [{"role": "user", "content": "Hello! Who are you?"}]
resp = client.chat.completions.create(model=model, messages=messages, max_tokens=5)
print("MODEL", resp.model)
print("TEXT", resp.choices[0].message.content)
print("USAGE", resp.usage.prompt_tokens if resp.usage else None)

stream = client.chat.completions.create(
    model=model, messages=messages, max_tokens=5, stream=True
)
models, text = set(), ""
for chunk in stream:
    models.add(chunk.model)
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
print("STREAM_MODELS", ",".join(sorted(models)))
print("STREAM_TEXT", text)
