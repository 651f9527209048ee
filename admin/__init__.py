"""The admin CLI (`rocketq admin ...`, alias `mqadmin`): talks the wire protocol to brokers through
`client.api.ClientAPI`. It depends on `protocol`, `conf` and `client`; never on `broker`."""
