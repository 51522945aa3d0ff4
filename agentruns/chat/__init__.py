"""Deciding from chat (README "Deciding from email and Slack"): the Block Kit message a
configuration's notification webhook posts (``slack_blocks``), and Slack's interactivity
endpoint (``slack_views``, mounted by ``slack_urls`` at ``integrations/slack/``), which verifies
Slack's signature (``slack_requests``) and hands each button press to
``agentruns.services.chat_decisions``.

Owns no state and decides nothing itself: every decision goes through
``agentruns.services.decisions.run_decide``, with its authority, four-eyes and deadline rules.
"""
