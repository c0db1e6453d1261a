"""A user's own ASGI service (lifespan included) with its own prometheus_client metric;
``cslb serve --app userasgi:app`` mounts cslb's paths into it."""

import json
import os

from prometheus_client import Counter

HELLOS = Counter("shop_async_hellos", "Hello requests this ASGI service answered.")
STATE = {"started": False}


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                STATE["started"] = True
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] != "/hello":
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b"the user's 404"})
        return
    HELLOS.inc()
    body = json.dumps({"hello": "async", "started": STATE["started"], "pid": os.getpid()})
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body.encode()})
