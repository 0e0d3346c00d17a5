"""Attention backends of the CP step (``step.AttentionBackend``) for frameworks other than Paddle.

``backends.torch`` is not imported here: ``paddle_fm3.distributed`` must import without torch."""
