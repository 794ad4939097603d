"""Controllers that drive decide(): the local runner (the operator lives in operator/)."""
