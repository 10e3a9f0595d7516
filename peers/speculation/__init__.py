"""Drafting and verifying: the generation loop, rounds in flight, how many drafts, sampling, trees and drafters."""
