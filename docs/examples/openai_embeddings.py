"""The official ``openai`` client against inferq's gateway.

    inferq worker --model minilm
    inferq gateway --port 8000
    OPENAI_BASE_URL=http://localhost:8000/v1 OPENAI_API_KEY=iq_... python openai_embeddings.py
"""

from openai import OpenAI

client = OpenAI()  # $OPENAI_BASE_URL (the gateway's /v1) and $OPENAI_API_KEY (an inferq key)
response = client.embeddings.create(model="minilm", input=["The cat sat on the mat.", "Hello"])
for item in response.data:
    print(item.index, item.embedding[:4])
