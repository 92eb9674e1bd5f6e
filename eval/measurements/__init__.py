"""What a checkpoint measures on held-out tokens: the loss at every early exit and with
layer sets skipped (exits), the held-out loss with its noise (heldout), the paper's
coordinate check (coord_check), and the plots of their reports (plots)."""
