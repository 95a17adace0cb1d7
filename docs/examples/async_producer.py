"""The same with ``inferq.AsyncClient``: every awaited result arrives over one connection.

    inferq worker --model echo=builtin:echo
    python async_producer.py
"""

import asyncio

import inferq


async def main() -> None:
    client = inferq.AsyncClient()  # $INFERQ_REDIS_URL, else redis://localhost:6379/0
    handles = [await client.enqueue(f"text {i}", model="echo") for i in range(3)]
    results = await client.results(handles, timeout=30)  # one future for the whole list
    print([r.output for r in results])
    await client.aclose()


asyncio.run(main())
