"""The daemon distribution's client programs: the `zerolayer` command (cli.py: ping, generate,
keys, ctl) and the HTTP+SSE edge (http_edge/, the `zerolayer-http` process). They reach a
daemon as any client does, through zerolayer.client, and are the only part of daemon/ that
imports the SDK; the serving core never imports them."""
