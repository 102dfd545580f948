"""GPU health: the rules as data (defaults.yaml, table.py, config.py), the pure state machine
(engine.py), the checker thread that feeds it (checker.py), the board holding its verdict
(board.py, verdict.py), the /health route and the publishers' own state (route.py,
publishing.py). The other publishers (exporter/deviceplugin/, nodestatus/, dra/) read the
verdict from the board; exporter/app.py connects them."""
