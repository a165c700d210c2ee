export PTB_FENCE_STORE=sqlite:///bot.sqlite3   # or a postgresql:// DSN

ptb-fence status                                         # what the table holds now
ptb-fence list --state failed                            # the failed updates
ptb-fence retry --state failed --older-than 1h --dry-run # what would be retried
ptb-fence retry --state failed --older-than 1h --json    # retry them: the ids changed
ptb-fence exhaustions                                    # updates the bot gave up on
ptb-fence ack --all --older-than 1d --dry-run            # exhaustions handled by hand
ptb-fence outbox list --state failed                     # replies Telegram refused
ptb-fence prune --older-than 7d                          # delete old settled rows
