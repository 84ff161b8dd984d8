"""3-D decoder: ConvTranspose3d + relu stages (up1..up3), then a ConvTranspose3d head."""
