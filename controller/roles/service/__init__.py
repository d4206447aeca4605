"""The service role's controller side: services and their endpoints: a provider's ports offered to consumers' VPCs."""
