"""tick(snapshot) -> plan; reconcile(plan) applies it idempotently; the daemon."""
