"""GPU health: rules (pure), the checker that feeds them, and the views that publish them."""
