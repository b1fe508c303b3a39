"""What a party keeps: checkpoints and resume, signed model bundles and the API that loads them."""
