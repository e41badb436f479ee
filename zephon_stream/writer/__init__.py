"""writer"""
