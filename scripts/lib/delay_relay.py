#!/usr/bin/env python3
"""A loopback TCP relay that delays every byte by a fixed time each way: a slow link between a
Pronto replica and NATS for scripts/replicas-live.sh (SYNC_DELAY). Order is kept; nothing is
dropped.

Usage: delay_relay.py LISTEN_PORT TARGET_PORT ONE_WAY_MS
Prints "ready" once listening.
"""
import asyncio
import sys


async def pipe(reader, writer, delay):
    queue = asyncio.Queue()

    async def write():
        loop = asyncio.get_running_loop()
        while True:
            due, chunk = await queue.get()
            if chunk is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(write())
    loop = asyncio.get_running_loop()
    try:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                break
            queue.put_nowait((loop.time() + delay, chunk))
    except ConnectionError:
        pass
    queue.put_nowait((0.0, None))
    try:
        await task
    except ConnectionError:
        pass


async def main(listen, target, delay):
    async def serve(client_r, client_w):
        try:
            server_r, server_w = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(pipe(client_r, server_w, delay), pipe(server_r, client_w, delay))

    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    listen_port, target_port, one_way_ms = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    asyncio.run(main(listen_port, target_port, one_way_ms / 1000.0))
