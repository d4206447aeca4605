"""The service role: the VPC gateway to the cluster's services (service endpoints)."""
