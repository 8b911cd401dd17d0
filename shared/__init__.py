"""What the agent and the controller both speak: wire schemas, spec models, the Xid catalog."""
