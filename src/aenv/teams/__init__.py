"""Teams and their API keys: who is asking, what they own, and how much they may run.

Every sandbox, template, snapshot, volume and secret belongs to one team; another team's
ids answer 404, as if they did not exist. A key belongs to one team; an admin key also
manages teams and keys. The node's own key (`api_key`) is the admin key of the `default`
team, so an install from before teams keeps working with the key it has.
"""
