# Stop the bot first: the pickle file must not change while it is copied.
export PTB_FENCE_STORE=sqlite:///bot.sqlite3   # the store your bot opens

# Copy user_data, chat_data, bot_data, conversations and callback data into the store.
ptb-fence persistence import bot.pickle        # --multi-file for single_file=False

# Check one user's state and its version.
ptb-fence persistence show --user 42

# Back out: write the store's state to a pickle file in PTB's format.
ptb-fence persistence export out.pickle
