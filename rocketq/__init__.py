"""The `rocketq` command: joins the broker's commands (`broker.cli`) and the admin CLI (`admin.cli`)."""
