"""Trained stop models read by adaptive drafting: the SpecDec++ acceptance head (`acceptance`) and its data and
training recipe (`acceptance_data`, `train_acceptance`); `common` holds helpers shared by every head."""
