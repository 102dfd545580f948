"""EXPOSE: the metric table, the text-format rendering and the HTTP endpoint that serves it.

metrics.py is the one table of every metric; render.py turns (snapshot, verdict) into bytes;
scrape.py owns which bytes answer a scrape (latest snapshot, verdict, cache); server.py only
carries those bytes over HTTP, with webconfig.py / authguard.py for TLS and basic auth.
"""
