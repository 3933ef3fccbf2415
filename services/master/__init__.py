"""The master: folds SHOAL_EVENTS, places models, assigns tasks, and turns silence into failures."""
