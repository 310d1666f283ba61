"""Outbound webhooks: signing, the retry schedule, the sender and the dispatcher loop."""
