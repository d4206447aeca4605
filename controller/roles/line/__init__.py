"""The line role's controller side: private lines to on-premise sites (BGP sessions, learned prefixes, sticky
placement)."""
