"""The local shell behind `shoal generate`: spawn a ring group on this machine (`launch`), check a
job before any rank starts (`local_run`), and the rank process itself (`rank_main`)."""
