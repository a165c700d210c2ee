"""Where the shipped alert rules and Grafana dashboard are."""

from ptb_fence.metrics import alert_rules_path, grafana_dashboard_path

print("alert rules:", alert_rules_path())  # copy it into Prometheus' rule_files
print("dashboard:", grafana_dashboard_path())  # import it in Grafana
