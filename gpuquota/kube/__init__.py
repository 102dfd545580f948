"""The Kubernetes corner both programs share: the client loader and raw list/watch
(client.py), the typed messages a watch hands its consumer (messages.py) and the back-off
every retry uses (backoff.py). The exporter reaches the API only through this package, never
through quota/."""
