"""Timer messages (RocketMQ 5's timer wheel, RIP-43): a message with TIMER_DELIVER_MS /
TIMER_DELAY_MS / TIMER_DELAY_SEC waits in `rmq_sys_wheel_timer` and is put back into its real
topic when due. See docs/timer.md."""
