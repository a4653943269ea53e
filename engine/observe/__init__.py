"""callwarden.observe"""
