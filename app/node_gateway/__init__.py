"""The node control gateway: the endpoint Node agents dial out to (aiohttp, WebSocket control sessions).

Modules: `protocol` (paths and message shapes shared with the agent), `aiodb` (async stored-function
calls), `reports` (report kind -> stored function registry), `files` (file providers agents fetch from),
`server` (the aiohttp application and its background loops).
"""
