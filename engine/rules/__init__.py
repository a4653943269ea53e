"""callwarden.rules"""
