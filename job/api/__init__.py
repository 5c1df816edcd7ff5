"""The jobs API: people trigger, read and cancel; workers poll, claim and report."""
