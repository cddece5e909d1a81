"""The framework-free rules shared by the torch and TensorFlow front ends."""
