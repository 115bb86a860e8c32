"""pbgtrain: a PyTorch-BigGraph compatible trainer built on the pbgio format SDK."""
