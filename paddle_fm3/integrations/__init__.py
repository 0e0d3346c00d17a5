"""Integrations of paddle_fm3 with training frameworks.

- ``paddle_fm3.integrations.paddleformers``: ``install()`` / ``uninstall()`` route
  PaddleFormers' ``"flashmask"`` attention backend to paddle_fm3 and register ``"fm3"``.

For code that calls Paddle's own ``flashmask_attention`` directly, see
``paddle_fm3.patch_paddle()``.
"""
