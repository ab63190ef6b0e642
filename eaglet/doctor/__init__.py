"""``eaglet doctor``: proves that training and serving feed the draft the same features, and
names the broken link when they do not. See docs/doctor.md."""
