"""GPU health: the verdict types, the tables (data) and their loader, the pure state machine,
the checker thread that feeds it, and the board and views that publish its verdict."""
