"""`rocketq console`: a web console over the admin client API (issue #42), the counterpart of
RocketMQ's rocketmq-dashboard. Starlette (ASGI) served by uvicorn on the same asyncio loop as the
admin client, Jinja2 templates, static CSS/JS shipped in `console/static` (no CDN). `console.cli`
holds the command line, `console.app` the routes, `console.server` runs it."""
