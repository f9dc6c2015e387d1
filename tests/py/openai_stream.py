"""Stream a chat completion through Pronto with the real OpenAI Python SDK.

Usage: python3 openai_stream.py BASE_URL MODEL
Prints the streamed text on one line, then `CHUNKS n`. Exits non-zero on any error.
"""
import sys

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
