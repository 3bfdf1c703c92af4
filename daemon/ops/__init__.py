"""The daemon's operations side: what an operator, systemd and Prometheus see and drive. The
control socket and its commands (control.py, control_commands.py), the metrics and their
rollup (metrics.py, rollup.py), the lifecycle's outward report (phase_report.py, sd_notify.py),
the logs, the collector's pauses, and the --check mode (check.py). The serving core reports
to them and carries out what an operator asks through them."""
