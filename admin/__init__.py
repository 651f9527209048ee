"""The admin CLI (`rocketq admin ...`, alias `mqadmin`): talks the wire protocol to brokers through
`client.api.ClientAPI`. It depends on `protocol`, `conf` and `client`, and on the broker only for
pure code it shows locally (the SQL92 compiler of `admin filter test`)."""
