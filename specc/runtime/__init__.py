"""The draft/verify loop and the small pure steps it is made of."""
