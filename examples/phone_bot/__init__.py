"""A Twilio phone bot on DurableGeminiLiveLLMService that survives its worker's death.

- server.py   the web app: voice webhook (TwiML <Connect><Stream> + <Redirect>), the Media
              Streams websocket, /healthz, /readyz
- bot.py      one call's pipeline (the part to copy into your bot)
- tools.py    two tools writing a side-effect ledger (one idempotent, one not)
- config.py   the worker's settings (environment)
- telephony.py, gemini_script.py, fleet.py   for tests and the demo only: Twilio and its
              load balancer, Google, and a fleet of workers with a SIGKILL in the middle
              (`make demo-fleet`; docs/operations.md)
"""
