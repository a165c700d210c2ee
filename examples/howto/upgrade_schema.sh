export PTB_FENCE_STORE=postgresql://bot@db/bot   # keeps the password out of the process list

# Before the deployment: is the table's schema current? Exit 1 names what is missing.
ptb-fence migrate --check || ptb-fence migrate

# Review the whole schema as SQL, without applying it.
ptb-fence schema > schema.sql
