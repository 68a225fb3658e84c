"""The training method: losses, EMA teacher, schedules and the SCFS / DINO LightningModule."""
